"""`kvbudget guard`: a KV-aware OpenAI-compatible proxy that degrades gracefully instead of running out of
memory. `policy` decides (pure functions), `signals` observes and predicts, `app` forwards."""
