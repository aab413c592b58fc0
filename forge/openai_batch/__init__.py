"""OpenAI batch files in and out (`forge run --openai-batch IN.jsonl --output OUT.jsonl`).

An OpenAI batch file (the input of OpenAI's Batch API and of `vllm run-batch`) is JSONL of
`{"custom_id", "method", "url", "body"}`; its output is JSONL of `{"id", "custom_id", "response",
"error"}`, one row per input line, in input order. Here such a file runs as a forge job with no
function file:

- `lines.py`: the whole file checked before any engine loads (shape, unique custom_ids, every body
  through forge serve's OpenAI request models), one line per bad input line;
- `answer.py`: the job's function: one input line to one output row, through the node as forge serve
  answers;
- `output.py`: the output in input order, made from the job's ledger-backed rows once every line has
  one;
- `job.py`: the whole job, from CLI options to exit code.
"""
