import sys

from kvbudget.cli import main

sys.exit(main())
