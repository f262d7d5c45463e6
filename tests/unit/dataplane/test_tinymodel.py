import hashlib
import json

import pytest

from baton.dataplane.tinymodel import DEFAULT_SHAPE, build_tiny_model


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    a = build_tiny_model(tmp_path_factory.mktemp("a"), seed=7)
    b = build_tiny_model(tmp_path_factory.mktemp("b"), seed=7)
    c = build_tiny_model(tmp_path_factory.mktemp("c"), seed=8)
    return a, b, c


def test_same_seed_gives_byte_identical_folder(built):
    a, b, _ = built
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    } <= set(names)
    for name in names:
        assert _digest(a / name) == _digest(b / name), name


def test_other_seed_gives_other_weights(built):
    a, _, c = built
    assert _digest(a / "model.safetensors") != _digest(c / "model.safetensors")


def test_config_matches_shape(built):
    cfg = json.loads((built[0] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 2
    assert cfg["hidden_size"] == 128
    assert cfg["num_attention_heads"] == 4
    assert cfg["num_key_value_heads"] == 2
    assert cfg["head_dim"] == 32
    assert cfg["vocab_size"] == 1024
    assert cfg["max_position_embeddings"] >= 4096
    assert DEFAULT_SHAPE.kv_bytes_per_token() == 2 * 2 * 2 * 32 * 4


def test_tokenizer_and_chat_template_load_like_a_hub_folder(built):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(built[0]))
    assert len(tok) == 1024
    text = "The engine reads the prompt before noon."
    assert tok.decode(tok(text).input_ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|begin_of_text|><|user|>\nhi<|end|>\n<|assistant|>\n"


def test_weights_load_and_attention_is_peaked(built):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(built[0]))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(built[0]), attn_implementation="eager")
    ids = tok(
        "The engine reads the prompt before noon and the gateway answers the client.", return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    # Peaked attention: on average the last token puts most of its weight on one position.
    top = torch.stack([a[0, :, -1, :].max(-1).values for a in out.attentions])
    assert top.mean().item() > 0.5


def test_the_embedding_kind_is_the_trunk_with_a_pooling_config(tmp_path):
    from safetensors.numpy import load_file

    from baton.dataplane.tinymodel import tiny_model_weights

    out = build_tiny_model(tmp_path / "embed", seed=7, kind="embed")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaModel"]
    weights = load_file(str(out / "model.safetensors"))
    full = tiny_model_weights(seed=7)
    assert set(weights) == {k.removeprefix("model.") for k in full} - {"lm_head.weight"}
    assert (weights["norm.weight"] == full["model.norm.weight"]).all()
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True


def test_the_tools_template_renders_calls_and_results_and_nothing_else_changes(built):
    transformers = pytest.importorskip("transformers")
    from baton.dataplane.tinymodel import TOOLS_CHAT_TEMPLATE

    tok = transformers.AutoTokenizer.from_pretrained(str(built[0]))
    plain = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    render = tok.apply_chat_template
    assert (render(plain, chat_template=TOOLS_CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True)
            == render(plain, tokenize=False, add_generation_prompt=True))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    turn = [*plain, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    text = tok.apply_chat_template(turn, tools=tools, chat_template=TOOLS_CHAT_TEMPLATE, tokenize=False,
                                   add_generation_prompt=True)
    assert '<tools>{"name": "get_weather"' in text
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert f"<|assistant|>\n<tool_call>\n{call}\n</tool_call><|end|>" in text
    assert "<tool_response>\nsunny\n</tool_response>" in text and text.endswith("<|assistant|>\n")
