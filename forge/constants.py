"""Bounds and tunables in one place, units in the names."""
import os

# Problems with the environment settings below, one line each; the CLI refuses to start while there
# are any.
ENVIRONMENT_PROBLEMS: list[str] = []


def _seconds_from_environment(name: str, default: float, low: float, high: float) -> float:
    """An operator's window, read once per process from the environment (vLLM sets its engine
    timeouts the same way: a node's card workers inherit it). Unset: `default`. Anything but a
    number of seconds in [low, high] is refused."""
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        ENVIRONMENT_PROBLEMS.append(f"environment variable {name}={text!r}: expected seconds from "
                                    f"{low:g} to {high:g} "
                                    f"(unset: {default:g})")
        return default
    return value


# --- files -----------------------------------------------------------------------------
MAX_CONFIG_FILE_BYTES = 1 * 1024 * 1024     # node/contract YAML larger than this is refused
MAX_CONFIG_DEPTH = 32                        # nesting deeper than this is refused
MAX_YAML_ALIASES = 64                        # alias expansions allowed per file (alias bombs)
MAX_INPUT_LINE_BYTES = 16 * 1024 * 1024      # one JSONL record larger than this is an error row
# One output row larger than this is a ResultTooLarge error row: a row is held whole in the ledger
# until it is written (SQLite refuses a value over 1e9 bytes, which failed the whole commit) and in
# the committer's queue.
MAX_OUTPUT_ROW_BYTES = 64 * 1024 * 1024

# --- runtime -------------------------------------------------------------------------
ENGINE_POLL_TIMEOUT_S = 0.05                 # every wait on an engine is bounded
ENGINE_START_TIMEOUT_S = 600.0
ENGINE_SHUTDOWN_TIMEOUT_S = 30.0
# Work in flight and no token for this long = a stall; a host or node that answers nothing this long
# is lost.
STALL_WINDOW_S = _seconds_from_environment("FORGE_STALL_WINDOW_S", 30.0, 1.0, 3600.0)
# A link session silent this long is gone and its work on the host dropped (in-process and Ray
# hosts; a card worker has none: its node's death is end of file on its socket).
SESSION_LEASE_S = _seconds_from_environment("FORGE_SESSION_LEASE_S", 60.0, 2.0, 86400.0)
SUBMIT_RETRY_LIMIT = 8                       # engine refusals retried with backoff, then failed
SUBMIT_BACKOFF_BASE_S = 0.01
SUBMIT_BACKOFF_MAX_S = 1.0
REQUEST_ATTEMPT_LIMIT = 3  # a request requeued more often than this fails its record

# --- what one generate request may ask (checked where it enters: GenerateParams) -------------
INT32_MAX = 2**31 - 1            # top_k, max_tokens, priority: engines hold them as int32
MIN_SAMPLING_TEMPERATURE = 0.01  # 0 is greedy; below this, logits / temperature can overflow
MAX_SAMPLING_TEMPERATURE = 1e4
MAX_DEADLINE_S = 7 * 24 * 3600.0
MAX_GUIDE_CHOICES = 4096  # choice lists: options, and bytes of them all (or of a JSON schema)
MAX_GUIDE_BYTES = 256 * 1024
MAX_STOP_STRINGS = 16     # stop strings of one generate (as vLLM's OpenAI server takes)
MAX_STOP_CHARS = 1024     # characters of one stop string
MAX_CHAT_MESSAGES = 1024  # messages of one llm.chat

# --- broker / functions --------------------------------------------------------------
BROKER_QUEUE_MAX_REQUESTS = 65536            # pending requests before producers wait
DEFAULT_RECORD_CONCURRENCY = 1024            # function invocations in flight (bounded async pool)
AFFINITY_LOAD_FACTOR = 1.25                  # bounded-load affinity: stick while load <= c * mean

MAX_ERRORS_MIN_SAMPLE = 100  # --max-errors P%: records settled in a run before the share counts

# --- exit codes of forge run / forge deploy (README, `forge run --help`) ---------------
EXIT_OK = 0          # every input line has its row; none is an error row
EXIT_FAILED = 1      # refused or failed before the run could start (one line says why)
EXIT_USAGE = 2       # bad flags or arguments
EXIT_ERROR_ROWS = 3  # every input line has its row; some are error rows
EXIT_INCOMPLETE = 4  # stopped with rows missing: rerun the same command to resume
                     # (130 / 143: the same, stopped by SIGINT / SIGTERM)

# --- ledger --------------------------------------------------------------------------
LEDGER_COMMIT_INTERVAL_S = 0.05
LEDGER_COMMIT_MAX_ROWS = 2048
