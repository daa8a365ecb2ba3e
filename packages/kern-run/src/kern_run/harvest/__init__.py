"""`kern harvest`: another engine's kernels (torch.compile's, through CUPTI) replayed by kern from a manifest.

The flow (docs/harvest.md), one module each:

- `capture` (GPU): record a model step (`torch_step.Qwen3Step`, or any `capture.HarvestStep`) under torch.compile
  with a CUPTI subscriber: cubins by sha256, launches with their parameter bytes (`launch_params`), allocations;
- `capture_format`: the capture directory `kern-harvest-capture/1`, its writer and strict reader;
- `cubin`: a cubin's kernels and parameter layouts from its ELF;
- `addresses`, `fit`, `mine`: classify every parameter by the tensors and allocations alive, fit what varies with
  the token count, agree the runs or report every problem (`errors.HarvestRefusal`);
- `workspace`, `generate`: pack the intermediates by lifetime and write the manifest with its pinned cubins;
- `replay`, `greedy`: run the harvested manifest with kern_runtime (GPU tests, bench/decode.py);
- `command`: what `kern harvest capture | mine | generate` call.

Importing this package imports nothing of CUDA, torch or cupti; `capture`, `torch_step` and `replay` do on use.
"""
