"""Build the tiny Llama used by the vLLM tests, the benchmark and local runs.

The config and tokenizer live in the repo (serving/assets/tiny_llama/); the weights are built here,
deterministically from a seed, into a gitignored directory. The init (std 0.2, far above the usual
0.02) makes the logits depend on the whole context, so a wrong KV cache changes the output.

    python scripts/build_tiny_model.py [--out var/models/tiny-llama] [--tokenizer]

`--tokenizer` retrains the committed tokenizer from the corpus below (only needed when editing it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "serving" / "assets" / "tiny_llama"
DEFAULT_OUT = REPO / "var" / "models" / "tiny-llama"
SEED = 0
INIT_STD = 0.2
VOCAB_SIZE = 1024
ASSET_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. A lazy cat sleeps in the warm sun.
Memory lending lets one GPU borrow idle memory from a neighbour and give it back on demand.
When a request is preempted, its key-value cache is copied out in one transfer and restored later.
A fair scheduler counts the service every request has received and serves the least served first.
Prompts are processed in chunks; every engine iteration decodes one token for each running request.
The cluster runs many models. Each model has replicas, and each replica runs on one or more GPUs.
Latency matters: the time to the first token and the time between tokens are what users notice.
Throughput matters too: tokens per second across all requests decide how many GPUs are needed.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Questions? Answers! Lists: red, green, blue; one, two.
Once upon a time a small model learned a small vocabulary and answered every question with words.
"""


def build_tokenizer(out_dir: Path = ASSETS) -> None:
    """Train the byte-level BPE tokenizer on CORPUS and write it with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin|>", "<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin|>",
        "eos_token": "<|end|>",
        "pad_token": "<|pad|>",
        "add_bos_token": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    special_map = {"bos_token": "<|begin|>", "eos_token": "<|end|>", "pad_token": "<|pad|>"}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 2,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": tok.token_to_id("<|begin|>"),
        "eos_token_id": tok.token_to_id("<|end|>"),
        "pad_token_id": tok.token_to_id("<|pad|>"),
    }
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def build_model(out_dir: Path = DEFAULT_OUT, force: bool = False) -> Path:
    """Write config, tokenizer and seeded weights to `out_dir` (skipped if already built).

    Returns:
        `out_dir`, ready for `vllm.LLM(model=str(out_dir))`.
    """
    out_dir = Path(out_dir)
    marker = out_dir / "model.safetensors"
    if marker.exists() and not force:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # Build in a scratch directory beside `out_dir` (same file system, so each file is renamed into
    # place): a failed or interrupted build leaves `out_dir` as it was.
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.", dir=out_dir.parent) as tmp:
        stage = Path(tmp)
        for name in ASSET_FILES:
            shutil.copyfile(ASSETS / name, stage / name)
        cfg = LlamaConfig.from_pretrained(str(stage))
        cfg.initializer_range = INIT_STD
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(cfg)
        model.save_pretrained(str(stage / "hf"), safe_serialization=True)  # its config.json is not ours
        out_dir.mkdir(exist_ok=True)
        for name in ASSET_FILES:
            os.replace(stage / name, out_dir / name)
        os.replace(stage / "hf" / "model.safetensors", marker)  # last: its presence means "built"
    return out_dir


def _out_dir(text: str) -> Path:
    path = Path(text)
    if not text.strip() or not path.name:  # "" or "." would build into the current directory
        raise argparse.ArgumentTypeError(f"{text!r} does not name a directory, e.g. var/models/tiny-llama")
    try:
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    except OSError as exc:  # Path.exists() raises for a name over NAME_MAX ("File name too long")
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.strerror or exc}") from None
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=_out_dir, default=DEFAULT_OUT, help="model directory (created if missing)")
    ap.add_argument("--tokenizer", action="store_true", help="retrain the committed tokenizer first")
    ap.add_argument("--force", action="store_true", help="rebuild the weights even if present")
    args = ap.parse_args(argv)
    if args.tokenizer:
        build_tokenizer()
    try:
        print(build_model(args.out, force=args.force or args.tokenizer))
    except OSError as exc:
        ap.error(f"cannot build the model in --out {args.out}: {exc}")


if __name__ == "__main__":
    main()
