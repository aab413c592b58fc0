"""User functions: the decorator and `llm` handle (api), loading a function file (loader), running a
job (runner)."""
