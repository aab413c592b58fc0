"""The node edge in one place (forge/node/interface.py's Node.submit): whatever edge a request comes
in by — a function's llm handle (forge run), the control endpoint through RemoteNode (forge deploy's
client), or forge serve's OpenAI and function endpoints — its prompt is checked once, its stop
strings and chat template are applied by the node, and the answer is the same. The real tiny model
on the real transformers engine, real HTTP on loopback; the prompt checks are counted with a profile
hook on the code objects, so a second check anywhere would show.

A model copy whose chat template is hostile (a loop of 10^10 steps, a 300 MB string) is refused in
one line naming its template, within the render's time bound, while the node's event loop keeps
turning."""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest

from forge.errors import RequestRejected
from forge.functions.api import GenerateParams
from forge.requests import params as request_params
from forge.requests import prompt_bounds
from tests.installed import skip_module_unless_installed

pytestmark = pytest.mark.slow
skip_module_unless_installed("transformers")

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "forge" / "embedded" / "tiny-llama"
PROMPTS = ["Alice was beginning to get very tired", "The Queen said", "Once upon a time"]
STOP = (" the", ",")


class CheckCounter:
    """Counts calls of the prompt checks on this thread, wherever they are called from."""

    def __init__(self):
        self.codes = {prompt_bounds.checked_prompt.__code__: "checked_prompt",
                      request_params.prompt_problem.__code__: "prompt_problem"}
        self.calls = {"checked_prompt": 0, "prompt_problem": 0}

    def __enter__(self):
        def hook(frame, event, arg):
            if event == "call" and frame.f_code in self.codes:
                self.calls[self.codes[frame.f_code]] += 1
        sys.setprofile(hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


async def _served(node, specs):
    from forge.web.server import QuietServer
    from forge.serve.app import ServeOptions, build_serve_app

    web = QuietServer(build_serve_app(node, specs, ServeOptions(port=0)), "127.0.0.1", 0)
    task = await web.start()
    return web, task, f"http://127.0.0.1:{web.port}"


def _local_node(node_yaml=None):
    from forge.config.load import load_node
    from forge.embedded import default_node_path
    from forge.node.local import LocalNode

    # worker processes, as forge run starts them
    return LocalNode(load_node(node_yaml or default_node_path()))


def test_one_check_per_request_and_the_same_answer_on_every_edge():
    from forge.functions.llm import NodeLLM
    from forge.functions.loader import load_function
    from forge.node.remote import RemoteNode

    spec = load_function(str(REPO / "functions" / "classify.py"))

    async def main():
        node = _local_node()
        await node.start()
        web, task, url = await _served(node, [spec])
        remote = RemoteNode(url)
        await remote.start()
        try:
            params = GenerateParams(max_tokens=24, stop=STOP)
            run, deploy, serve = [], [], []
            with CheckCounter() as count:
                for p in PROMPTS:  # forge run: the function's llm handle
                    run.append(await NodeLLM(node).generate(p, max_tokens=24, stop=list(STOP)))
                run_checks = dict(count.calls)
                for p in PROMPTS:  # forge deploy: RemoteNode -> /v1/generate
                    deploy.append((await remote.submit(p, params)).generation)
                deploy_checks = {k: v - run_checks[k] for k, v in count.calls.items()}
                async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                    for p in PROMPTS:                              # forge serve: /v1/completions
                        r = await client.post(
                            "/v1/completions",
                            json={
                                "model": "tiny-llama-cpu",
                                "prompt": p,
                                "max_tokens": 24,
                                "temperature": 0,
                                "stop": list(STOP),
                            },
                        )
                        assert r.status_code == 200, r.text
                        serve.append(r.json())
                    r = await client.post(f"/v1/functions/{spec.name}", json={"text": PROMPTS[0]})
                    assert r.status_code == 200, r.text
                total = dict(count.calls)
            # one check per request: 3 on the function path, 3 through the control endpoint, 3 + the
            # function's own generate calls on serve
            assert run_checks["checked_prompt"] == 3 and run_checks["prompt_problem"] <= 3, (
                run_checks
            )
            assert deploy_checks["checked_prompt"] == 3 and deploy_checks["prompt_problem"] <= 3, (
                deploy_checks
            )
            serve_checks = total["checked_prompt"] - 6
            assert serve_checks >= 4 and total["prompt_problem"] <= total["checked_prompt"], total
            for a, b, c in zip(run, deploy, serve):
                choice = c["choices"][0]
                assert a.text == b.text == choice["text"], (a, b, c)
                assert a.finish_reason == b.finish_reason
                assert (a.output_tokens, a.input_tokens) == (b.output_tokens, b.input_tokens) == \
                    (c["usage"]["completion_tokens"], c["usage"]["prompt_tokens"])
                if a.finish_reason == "stop":
                    assert choice["finish_reason"] == "stop" and choice["stop_reason"] in STOP
            assert any(g.finish_reason == "stop" for g in run), run  # the stops did cut something
            # the same refusal on every edge: a prompt that is not one, a schema that admits nothing
            for bad, schema in (([1, "2"], None), ("x", {"not": {}})):
                p = GenerateParams(max_tokens=4, json_schema=schema)
                with pytest.raises(RequestRejected) as local_err:
                    await node.submit(bad, p)
                with pytest.raises(RequestRejected) as remote_err:
                    await remote.submit(bad, p)
                assert str(local_err.value) == str(remote_err.value)
        finally:
            await remote.close()
            web.server.should_exit = True
            await asyncio.wait_for(task, 30)
            await node.stop()

    asyncio.run(main())


HOSTILE = {
    "loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ "
            "messages[0].content }}",
    "huge": "{{ 'x' * 300000000 }}",
}


def _model_with_template(tmp_path: Path, template: str) -> Path:
    """A copy of the tiny model whose tokenizer_config.json holds `template`, and a node for it
    (forge contract new)."""
    from tests.forge_cli import fill_in
    from tests.reliability._rel import forge

    model = tmp_path / "tiny-hostile"
    shutil.copytree(TINY, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    r = forge(
        "contract",
        "new",
        model,
        "--card",
        "cpu",
        "--memory-gib",
        "0.25",
        "--max-input-len",
        "256",
        "--max-output-len",
        "64",
        "--out",
        tmp_path / "c.yaml",
        "--node-out",
        tmp_path / "node.yaml",
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    return fill_in(tmp_path / "node.yaml", memory_gib=8, cpu_cores=2)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_chat_template_is_refused_in_bounded_time_off_the_loop(
    tmp_path, monkeypatch, kind
):
    from forge.functions.llm import NodeLLM
    from forge.requests import chat_template_render

    monkeypatch.setattr(chat_template_render, "RENDER_TIMEOUT_S", 3.0)
    node_yaml = _model_with_template(tmp_path, HOSTILE[kind])

    async def main():
        node = _local_node(node_yaml)
        await node.start()
        ticks = 0

        async def ticker():          # the loop must keep turning while the template renders
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        beat = asyncio.ensure_future(ticker())
        try:
            t0 = time.monotonic()
            with pytest.raises(RequestRejected) as err:
                await NodeLLM(node).chat([{"role": "user", "content": "hi"}], max_tokens=4)
            took = time.monotonic() - t0
            message = str(err.value)
            assert "\n" not in message and "tokenizer_config.json's chat_template" in message, (
                message
            )
            if kind == "loop":
                assert "ran longer than 3 s" in message and took < 30, (message, took)
                assert ticks >= 20, ticks  # ~60 ticks in 3 s; none if it ran on the loop
            else:
                assert "makes more than" in message and took < 30, (message, took)
            # the node still answers a plain request
            gen = await NodeLLM(node).generate("Alice", max_tokens=2)
            assert gen.output_tokens >= 1
        finally:
            beat.cancel()
            await node.stop()

    asyncio.run(main())
