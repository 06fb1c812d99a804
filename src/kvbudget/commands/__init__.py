"""What each command is asked and how it answers, for every front end: a typed request per command (its fields
described once, from which the command line makes its flags and the web page its parameters) and the function
that answers it with the library. `spelling` says how the command line names parameters."""
