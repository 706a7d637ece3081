"""LoRA adapters through peft, on the trainable model of any stage (`model.lora.rank > 0`).

The adapter is injected into the transformers model itself (peft's LoRA layers replace the targeted
Linear layers), so every forward in rlft -- causal LM, reward and value heads, generation -- runs
through it unchanged. Only the adapter trains, plus a reward or value model's scalar head. What rlft
writes stays a plain Hugging Face model:

    merged_state_dict   W = W_base + scaling * B @ A for every adapted layer, under the plain names
    adapter_state_dict  the adapter alone, picked and named by peft (PeftModel.from_pretrained reads it)
    adapter_disabled    the base model for the duration: RL's reference without a second copy

QLoRA (`model.lora.load_in_4bit`): the base is loaded in 4 bits by transformers' bitsandbytes support;
what rlft writes or syncs is dequantized first (dequantized_state_dict, plain_weight), so final/ is
the same plain model.

docs/lora.md has the options and what was tested.
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch

BASE = ".base_layer."
ADAPTER = "default"  # peft's name for the one adapter rlft trains


def enabled(model_cfg) -> bool:
    return int(model_cfg.lora.rank) > 0


def quantized(model_cfg) -> bool:
    """QLoRA: the trained model's base weights in 4 bits (model.lora.load_in_4bit)."""
    return enabled(model_cfg) and bool(getattr(model_cfg.lora, "load_in_4bit", False))


def quantization_config(compute_dtype: torch.dtype):
    """transformers' bitsandbytes config for QLoRA's base: NF4 with double quantization (the QLoRA paper's),
    matmuls in the training precision."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ImportError("model.lora.load_in_4bit=true needs bitsandbytes: pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    # the output layer and the reward/value heads (`score`, trained whole) stay in full precision
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype, llm_int8_skip_modules=["lm_head", "score"])


def keep_standard_layout(model: torch.nn.Module) -> None:
    """On CPUs with AVX512-BF16, bitsandbytes repacks a 4-bit weight into its CPU kernel's layout at the first
    no-grad forward (a sampling step). rlft reads the 4-bit weights in the standard layout (merging, export,
    the reference's forward), and the repacking fails outright for layers narrower than a quantization block
    ("shape '[32, 0]' is invalid"); so every 4-bit layer keeps the standard layout."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def is_4bit(p) -> bool:
    return type(p).__name__ == "Params4bit"


def plain_weight(p: torch.Tensor) -> torch.Tensor:
    """A weight as a plain model holds it: a 4-bit (QLoRA) base weight dequantized, any other as it is."""
    if not is_4bit(p):
        return p
    import bitsandbytes as bnb

    return bnb.functional.dequantize_4bit(p.data, p.quant_state)


def dequantized_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` with every 4-bit base weight dequantized and its quantization statistics (the
    `<weight>.absmax`, `.quant_map`, ... entries) dropped; unchanged for a model without 4-bit weights."""
    quant = {name: p for name, p in model.named_parameters() if is_4bit(p)}
    if not quant:
        return state
    out = {}
    for key, value in state.items():
        if ".weight." in key and key.split(".weight.")[0] + ".weight" in quant:
            continue
        out[key] = plain_weight(quant[key]).detach().cpu() if key in quant else value
    return out


@contextlib.contextmanager
def unquantized_view(model: torch.nn.Module):
    """For the duration, transformers sees `model` as a plain model (no quantizer, no quantization_config),
    so save_pretrained writes the state dict it is given (dequantized) and a config that loads plainly."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        yield model
        return
    qconfig = model.config.quantization_config
    model.hf_quantizer = None
    del model.config.quantization_config
    try:
        yield model
    finally:
        model.hf_quantizer, model.config.quantization_config = quantizer, qconfig


def add_adapter(model: torch.nn.Module, lora_cfg) -> torch.nn.Module:
    """Inject a LoRA adapter (rank, alpha, dropout, target modules) into `model` in place and return it.
    Base weights are frozen; a reward/value model's scalar head (`score`) stays trainable."""
    import peft

    head = ["score"] if getattr(model, "score", None) is not None else None  # trained whole, not adapted
    config = peft.LoraConfig(r=int(lora_cfg.rank), lora_alpha=float(lora_cfg.alpha), lora_dropout=float(lora_cfg.dropout),
                             target_modules=_targets(lora_cfg.target_modules), exclude_modules=head, bias="none")
    wrapped = peft.get_peft_model(model, config, adapter_name=ADAPTER)
    model = wrapped.get_base_model()
    if head:
        model.score.requires_grad_(True)
    model.rlft_lora_config = config
    return model


def _targets(names) -> str | list[str]:
    names = [str(n) for n in names]
    return names[0] if names == ["all-linear"] else names


def has_adapter(model: torch.nn.Module) -> bool:
    return hasattr(model, "rlft_lora_config")


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """{module name: peft LoRA layer} of the model."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module):
    """The base model (every adapter off) for the duration."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def layer_delta(layer, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The weight update of one LoRA layer, shaped like its base weight."""
    delta = (b.float() @ a.float()) * float(layer.scaling[ADAPTER])
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


def merged_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state dict of the adapted model -> the plain model's, each adapted weight merged."""
    layers = lora_layers(model)
    out = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        name = key.replace(BASE, ".")
        module = key.split(BASE)[0] if BASE in key else None
        if module in layers and name.endswith(".weight"):
            a, b = state[f"{module}.lora_A.{ADAPTER}.weight"], state[f"{module}.lora_B.{ADAPTER}.weight"]
            value = (value.float() + layer_delta(layers[module], a, b)).to(value.dtype)
        out[name] = value
    return out


def merged_weights(model: torch.nn.Module, named):
    """(plain name, weight) from (name, weight) pairs of the adapted model, as a weight sync wants them:
    a base weight is held back until its layer's A and B have passed, then handed out merged."""
    layers = lora_layers(model)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in named:
        if BASE in key:
            module, _, leaf = key.partition(BASE)
            if module in layers and leaf == "weight":
                pending[module] = {"base": value}
            else:
                yield key.replace(BASE, "."), value
            continue
        if ".lora_" not in key:
            yield key, value
            continue
        module = key.split(".lora_")[0]
        parts = pending[module]
        parts["A" if ".lora_A." in key else "B"] = value
        if len(parts) == 3:
            del pending[module]
            merged = parts["base"].float() + layer_delta(layers[module], parts["A"], parts["B"])
            yield f"{module}.weight", merged.to(parts["base"].dtype)


def adapter_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a full (gathered) state dict, as peft saves them: peft picks and names
    them (get_peft_model_state_dict); the `base_model.model.` prefix is where a PeftModel holds the model
    that rlft trains unwrapped."""
    from peft import get_peft_model_state_dict

    picked = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER)
    return {"base_model.model." + k: v.contiguous() for k, v in picked.items()}


def save_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor], out_dir: Path) -> None:
    """Write the adapter as peft does (its LoraConfig.save_pretrained, adapter_model.safetensors), so that
    PeftModel.from_pretrained reads it; a reward model's trained head is in the merged model beside it."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.rlft_lora_config)
    config.base_model_name_or_path = None  # the merged model beside it is the plain model; no hub id
    config.save_pretrained(str(out_dir))
    save_file(adapter_state_dict(model, state), str(out_dir / "adapter_model.safetensors"))
