"""`kern serve`: an OpenAI-compatible HTTP server over a continuous-batching scheduler (docs/serve.md).

Modules, one idea each:
- `sampling`: per-request sampling parameters (frozen) and the greedy-only check.
- `engine`: the `Engine` protocol the scheduler drives (prefill a chunk, decode a step of rows), `decode_bucket`.
- `memory`: the `KvMemory` protocol (kern_pool's lease / checkpoint / park / wake) and its two implementations:
  `PoolMemory` over a bare kern_pool Pool + Host (tests) and `RuntimeMemory` over a kern_runtime Runtime.
- `scheduler`: pure host logic over kern_pool: admission, chunked prefill under a token budget, prefix reuse,
  park / wake, preemption, cancellation. No HTTP, no CUDA.
- `fake_engine`: a deterministic CPU engine for tests.
- `runtime_engine`: the real engine: decode steps of 1..64 rows at power-of-two buckets, GPU sampling where the
  manifest has it (greedy argmax otherwise; the manifest's sampler read by `kern_run.sampling_io`, as for
  `kern run`).
- `loop`: the scheduler thread that owns the engine; the HTTP layer talks to it through queues.
- `protocol`: the OpenAI request / response models (pydantic).
- `logprobs`: log-probabilities in the completions and chat response shapes.
- `chat_template`: tokenizer_config.json's chat template, rendered as transformers does.
- `metrics`: the Prometheus metrics.
- `app`: the FastAPI application.
- `server`: `kern serve`: load a target, run uvicorn, drain on SIGTERM.
"""
