"""Baton's default model: a tiny Llama built locally and deterministically from a seed.

Nothing is downloaded. The output is an ordinary Hugging Face model folder (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``,
``chat_template.jinja``), so vLLM loads it through the same path as a real model.

Determinism: the weights come from NumPy's PCG64 generator seeded with ``seed`` and are written with
fixed tensor order and metadata, so the same seed gives a byte-identical ``model.safetensors``. The
tokenizer is a byte-level BPE trained with ``tokenizers`` on a corpus generated from ``seed`` too.

The query/key projections get a larger init scale than the other matrices, so attention is peaked
and the model's outputs depend on which KV it reads: with a uniform-attention random model, a wrong
KV layout can still give the same tokens, and the tests would prove nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from baton.core.contracts import kv_bytes
from baton.dataplane._tiny_corpus import corpus_lines

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|pad|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
)
BOS, EOS, PAD, END = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|end|>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

TOOLS_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|system|>\\nYou may call these functions. To call one, answer '"
    "'<tool_call>{\"name\": <name>, \"arguments\": <object>}</tool_call>.\\n<tools>' }}"
    "{% for tool in tools %}{{ (tool.function if tool.function is defined else tool) | tojson }}{% endfor %}"
    "{{ '</tools><|end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|user|>\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response><|end|>\\n' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\\n' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set args = call['function']['arguments'] %}"
    "{{ '<tool_call>\\n{\"name\": ' }}{{ call['function']['name'] | tojson }}{{ ', \"arguments\": ' }}"
    "{% if args is string %}{{ args }}{% else %}{{ args | tojson }}{% endif %}{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""The tiny model's chat template with tools (Hermes's format: vLLM's ``hermes`` tool-call parser reads it):
tool signatures in a system turn, assistant tool calls as ``<tool_call>`` blocks, tool results as
``<tool_response>`` blocks. Without tools it renders what :data:`CHAT_TEMPLATE` renders. ``baton up``
puts it in the catalogue (``chat_template``) of the demo model."""

TinyKind = Literal["generate", "embed"]
"""``generate``: a causal LM (``LlamaForCausalLM``); ``embed``: the same trunk without the LM head
(``LlamaModel``, Hugging Face's layout) with a sentence-transformers pooling config (mean pooling, then
L2 normalisation), so vLLM serves it with its pooling runner."""

ProgressFn = Callable[[str, int, int], None]
"""Called as ``progress(step_name, done, total)`` while the model is built."""


@dataclass(frozen=True)
class TinyModelShape:
    """The tiny model's architecture (Llama)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    qk_init_std: float = 0.2
    """Init scale of q_proj/k_proj: ~0.2 gives per-head attention logits with a spread of several
    units, i.e. peaked attention (0.02 would make attention uniform)."""

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """KV bytes per token (:func:`baton.core.contracts.kv_bytes`)."""
        return kv_bytes(num_layers=self.num_hidden_layers, num_kv_heads=self.num_key_value_heads,
                        head_dim=self.head_dim, bytes_per_element=dtype_bytes)


DEFAULT_SHAPE = TinyModelShape()


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    shape: TinyModelShape = DEFAULT_SHAPE,
    kind: TinyKind = "generate",
    progress: ProgressFn | None = None,
) -> Path:
    """Write the tiny model (of ``kind``) into ``out_dir`` (created if missing) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = 3

    def report(name: str, done: int) -> None:
        if progress is not None:
            progress(name, done, steps)

    report("tokenizer", 0)
    _write_tokenizer(out, seed=seed, shape=shape)
    report("weights", 1)
    _write_weights(out, seed=seed, shape=shape, kind=kind)
    report("config", 2)
    _write_configs(out, seed=seed, shape=shape, kind=kind)
    report("done", 3)
    return out


def _write_tokenizer(out: Path, *, seed: int, shape: TinyModelShape) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(seed), trainer=trainer)
    if tok.get_vocab_size() != shape.vocab_size:
        raise RuntimeError(
            f"tokenizer training gave {tok.get_vocab_size()} tokens, expected {shape.vocab_size}: "
            "the built-in corpus is too small for this vocabulary"
        )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out / "tokenizer.json"))

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": END,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": shape.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": END, "pad_token": PAD},
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _weight_specs(shape: TinyModelShape) -> list[tuple[str, tuple[int, ...], float | None]]:
    """(name, shape, init std) in a fixed order; std None means a norm weight of ones."""
    h, i, v, d = shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.head_dim
    q_out, kv_out = shape.num_attention_heads * d, shape.num_key_value_heads * d
    specs: list[tuple[str, tuple[int, ...], float | None]] = [("model.embed_tokens.weight", (v, h), 1.0)]
    for layer in range(shape.num_hidden_layers):
        p = f"model.layers.{layer}"
        specs += [
            (f"{p}.input_layernorm.weight", (h,), None),
            (f"{p}.self_attn.q_proj.weight", (q_out, h), shape.qk_init_std),
            (f"{p}.self_attn.k_proj.weight", (kv_out, h), shape.qk_init_std),
            (f"{p}.self_attn.v_proj.weight", (kv_out, h), h**-0.5),
            (f"{p}.self_attn.o_proj.weight", (h, q_out), q_out**-0.5),
            (f"{p}.post_attention_layernorm.weight", (h,), None),
            (f"{p}.mlp.gate_proj.weight", (i, h), h**-0.5),
            (f"{p}.mlp.up_proj.weight", (i, h), h**-0.5),
            (f"{p}.mlp.down_proj.weight", (h, i), i**-0.5),
        ]
    specs += [("model.norm.weight", (h,), None), ("lm_head.weight", (v, h), 4.0 * h**-0.5)]
    return specs


def tiny_model_weights(*, seed: int, shape: TinyModelShape = DEFAULT_SHAPE) -> dict[str, npt.NDArray[np.float32]]:
    """The tiny model's tensors (float32), generated from ``seed``."""
    rng = np.random.Generator(np.random.PCG64(seed))
    tensors: dict[str, npt.NDArray[np.float32]] = {}
    for name, dims, std in _weight_specs(shape):
        if std is None:
            tensors[name] = np.ones(dims, dtype=np.float32)
        else:
            tensors[name] = (rng.standard_normal(dims, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return tensors


def _write_weights(out: Path, *, seed: int, shape: TinyModelShape, kind: TinyKind = "generate") -> None:
    from safetensors.numpy import save_file

    tensors = tiny_model_weights(seed=seed, shape=shape)
    if kind == "embed":  # the trunk alone, named as Hugging Face's LlamaModel names it
        tensors = {k.removeprefix("model."): v for k, v in tensors.items() if k != "lm_head.weight"}
    save_file(
        tensors,
        str(out / "model.safetensors"),
        # One metadata key only: safetensors writes metadata from a hash map, so several keys would come
        # out in a different order on each run and break byte-identical output.
        metadata={"format": "pt"},
    )


def _write_configs(out: Path, *, seed: int, shape: TinyModelShape, kind: TinyKind = "generate") -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    bos, eos, end, pad = (tok.token_to_id(t) for t in (BOS, EOS, END, PAD))
    config = {
        "architectures": ["LlamaModel" if kind == "embed" else "LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": bos,
        "eos_token_id": [end, eos],
        "pad_token_id": pad,
        "torch_dtype": "float32",
        "use_cache": True,
        "baton": {"seed": seed, "shape": asdict(shape), "kind": kind},
    }
    _write_json(out / "config.json", config)
    if kind == "embed":
        _write_json(out / "modules.json", [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ])
        (out / "1_Pooling").mkdir(exist_ok=True)
        _write_json(out / "1_Pooling" / "config.json",
                    {"word_embedding_dimension": shape.hidden_size, "pooling_mode_mean_tokens": True,
                     "pooling_mode_cls_token": False, "pooling_mode_max_tokens": False,
                     "pooling_mode_lasttoken": False})
        (out / "2_Normalize").mkdir(exist_ok=True)
        return
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos, "eos_token_id": [end, eos], "pad_token_id": pad, "do_sample": False},
    )


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
