"""An OpenAI batch file checked as a whole before any engine loads: every line an object with a
string `custom_id` (unique in the file), `method` POST, a `url` forge answers and a `body` that
forge serve's OpenAI request models accept (forge/serve/openai_models.py: the same parameter table,
the same refusals). A file with problems is refused with one line per bad input line, naming the
file, the line and the custom_id."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from forge.errors import ForgeError, display_path
from forge.records.reader import InputError
from forge.records.shards import open_input
from forge.web.errors import validation_message
from forge.serve.openai_api import BadRequest, guide_params
from forge.serve.openai_models import ChatRequest, CompletionRequest
from forge.serve.openai_params import refusal

CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
)
SHOWN_PROBLEMS = 20          # lines named in a refusal; the rest are counted
MAX_CUSTOM_ID_CHARS = 512


class EmbeddingRequest(BaseModel):
    """The body of /v1/embeddings: OpenAI's fields, `dimensions` refused (the model's width only)."""
    model_config = ConfigDict(extra="forbid")
    model: str
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None            # an end-user id for OpenAI's abuse monitoring: no effect

    @model_validator(mode="after")
    def _supported(self):
        if self.dimensions is not None:
            raise refusal("dimensions", "dimensions is not supported by forge: embeddings have the "
                                        "model's width")
        if self.input in ("", []) or (
            isinstance(self.input, list) and any(p in ("", []) for p in self.input)
        ):
            raise refusal("input", "input: give a non-empty string, token ids, or a non-empty list "
                                   "of them")
        return self

    @property
    def inputs(self) -> list[Union[str, list[int]]]:
        p = self.input
        if isinstance(p, str) or all(isinstance(t, int) for t in p):
            return [p]
        return list(p)


MODELS = {
    CHAT_URL: ChatRequest,
    COMPLETIONS_URL: CompletionRequest,
    EMBEDDINGS_URL: EmbeddingRequest,
}


class LineRefused(ValueError):
    """What is wrong with one line: `message` (one line) and the parameter, as OpenAI's error names it."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def parse_body(url: str, body: Any) -> BaseModel:
    """The request model of one line's body (forge serve's, for the two generation endpoints), or LineRefused.
    A batch line answers one choice (n=1) and is never streamed, as OpenAI's Batch API and vLLM's take them."""
    model = MODELS.get(url)
    if model is None:
        raise LineRefused(f"url {url!r} is not one forge answers ({', '.join(MODELS)})", "url")
    if not isinstance(body, dict):
        raise LineRefused("body must be a JSON object (the request's parameters)", "body")
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        message, param = validation_message(list(e.errors(include_url=False)))
        raise LineRefused(message, param) from None
    if url == EMBEDDINGS_URL:
        return req
    if (req.n or 1) != 1:
        raise LineRefused(f"n={req.n}: a batch line answers one choice (n=1); give each choice a "
                          "line of its own",
                          "n")
    if req.stream:
        raise LineRefused(
            "stream: a batch line is answered whole, never streamed (stream: false)", "stream"
        )
    try:
        guide_params(req)
    except BadRequest as e:
        raise LineRefused(str(e), e.param) from None
    return req


def check_line(record: Any) -> tuple[str, str, BaseModel]:
    """(custom_id, url, body model) of one parsed input line, or LineRefused (custom_id unknown then)."""
    if not isinstance(record, dict):
        raise LineRefused("a batch line is an object {custom_id, method, url, body}")
    extra = sorted(set(record) - {"custom_id", "method", "url", "body"})
    if extra:
        raise LineRefused(f"unknown field {extra[0]!r} (a batch line has custom_id, method, url, "
                          "body)", extra[0])
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineRefused("custom_id must be a non-empty string", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise LineRefused(f"custom_id is {len(custom_id):,} characters; at most "
                          f"{MAX_CUSTOM_ID_CHARS} are taken",
                          "custom_id")
    if record.get("method") != "POST":
        raise LineRefused(f"method {record.get('method')!r}: batch requests are POST", "method")
    url = record.get("url")
    if not isinstance(url, str):
        raise LineRefused("url must be a string", "url")
    return custom_id, url, parse_body(url, record.get("body"))


@dataclass
class CheckedFile:
    path: Path
    lines: int = 0
    # model -> first line (1-based) that names it
    models: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)          # at most SHOWN_PROBLEMS
    bad_lines: int = 0


def check_file(path: Path) -> CheckedFile:
    """Read the whole file once (bounded memory but for the custom_ids); every problem counted, the first
    SHOWN_PROBLEMS kept as one line each."""
    shown = display_path(path)
    out = CheckedFile(path=path)
    first_line_of: dict[str, int] = {}
    source = open_input(path)
    if getattr(source, "is_pipe", False):
        raise ForgeError(f"--openai-batch {shown}: a pipe cannot be checked before the run and "
                         "read again; "
                         "give a file")
    for index, record in source.records():
        line = index + 1
        out.lines = line
        problem = None
        cid = record.get("custom_id") if isinstance(record, dict) else None
        if isinstance(record, InputError):
            problem = (
                record.message.split(": ", 1)[-1]
                if record.message.startswith(shown)
                else record.message
            )
        else:
            try:
                cid, _, body = check_line(record)
                if cid in first_line_of:
                    problem = f"duplicate custom_id (first on line {first_line_of[cid]})"
                else:
                    first_line_of[cid] = line
                    out.models.setdefault(body.model, line)
            except LineRefused as e:
                problem = str(e)
        if problem is not None:
            out.bad_lines += 1
            if len(out.problems) < SHOWN_PROBLEMS:
                named = f" custom_id {cid!r}:" if isinstance(cid, str) else ""
                out.problems.append(f"{shown}:{line}:{named} {problem}")
    return out


def refuse_problems(checked: CheckedFile) -> None:
    """ForgeError listing the problems (one line each), when there are any."""
    if not checked.bad_lines:
        if checked.lines == 0:
            raise ForgeError(f"{display_path(checked.path)}: no batch lines (an empty file)")
        return
    more = checked.bad_lines - len(checked.problems)
    tail = [f"... and {more:,} more line(s) with problems"] if more else []
    raise ForgeError("\n".join(checked.problems + tail + [
        f"{display_path(checked.path)}: {checked.bad_lines:,} of {checked.lines:,} batch lines "
        "refused; nothing "
        "ran (docs/openai_batch.md lists what a line may hold)"]))
