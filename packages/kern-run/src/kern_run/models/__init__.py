"""Model families: each subpackage turns a checkpoint's config.json into kern manifests (docs/manifest.md).

`kern_run.models.family` describes the dense decoder families (Qwen3, Llama 3.x: q/k norm, RoPE frequencies, bias
flags, defaults, tensor names) and picks one from a config.json; `kern_run.models.qwen3` is the manifest builder they
share; `kern manifest build` and `kern run --weights DIR` reach it.
"""
