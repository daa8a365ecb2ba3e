"""Model families: each subpackage turns a checkpoint's config.json into kern manifests (docs/manifest.md).

`kern_run.models.qwen3` is the Qwen3 dense family; `kern manifest build` reaches it.
"""
