"""A card whose engine does not come up is reported in one line, the same wherever it is seen
(forge/errors.py::engine_failed_to_start: the factory, the worker, its link, the local node, a
cluster agent)."""
from __future__ import annotations

from pathlib import Path

import pytest

from forge.config.models import Card, Contract
from forge.config.plan import plan_card
from forge.errors import ForgeError, engine_failed_to_start
from forge.host import engine_host

TINY = Path(__file__).resolve().parents[2] / "forge" / "embedded" / "tiny-llama"


def _plan():
    c = Contract.model_validate(
        dict(
            contract="t",
            backend="instant",
            model=dict(
                architecture="LlamaForCausalLM",
                num_layers=4,
                num_kv_heads=4,
                head_dim=32,
                vocab_size=2048,
                weights_gib=0.0,
            ),
            artifact=dict(checkpoint=str(TINY)),
            precision=dict(weights="fp32", kv_cache="fp32"),
            limits=dict(
                max_batch_size=4, max_num_tokens=512, max_input_len=384, max_output_len=128
            ),
            kv_cache=dict(
                tokens_per_block=32, max_tokens=4096, host_cache_size=0, block_reuse=True
            ),
            target=dict(kind="cpu"),
        )
    )
    return plan_card(Card(index=0, kind="cpu", model="cpu", memory_gib=2, engine=c.contract), c)


def test_the_message_names_the_card_its_contract_and_why():
    assert str(engine_failed_to_start("cpu0", "t", "its worker process exited with code 3")) == \
        "card cpu0 (t): engine failed to start: its worker process exited with code 3"
    assert str(engine_failed_to_start("cpu0", "t", MemoryError("no room"))) == \
        "card cpu0 (t): engine failed to start: MemoryError: no room"


def test_a_factory_that_raises_fails_its_card_in_that_one_line(monkeypatch):
    def broken(contract, plan):
        raise RuntimeError("cannot map the weights")

    monkeypatch.setattr("forge.backends.factory", lambda name, *, card: broken)
    with pytest.raises(ForgeError) as e:
        engine_host.build_engine(_plan())
    assert (
        str(e.value)
        == "card cpu0 (t): engine failed to start: RuntimeError: cannot map the weights"
    )
