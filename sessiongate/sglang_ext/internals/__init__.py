"""Every reference to SGLang's internals, pinned to sglang 0.5.23: nothing else in `sessiongate` imports `sglang.srt`.

The package is split along the process seam:

- `patches`: the version pin (`require_supported_version`) and the CPU patches `cpu_compat` applies;
  `plugin_ops`: what the plug-in reads from and adds to SGLang's server (the server's facts, the info
  route, the tool parser);
- `ipc`: the request/reply types the HTTP process and the scheduler exchange over SGLang's own
  ZMQ channels (registered with its msgpack codec), and the hooks that install them;
- `scheduler_ops`: what runs on the scheduler's thread (`SchedulerExtension`): the prefetches from the
  L3 pool into host and device memory with UnifiedRadixCache's own machinery (`prefetch_jobs`, the
  copies a batch must wait for in `load_guard`), the session KV operations (`session_kv_ops`; the
  tree walks in `kv_ops`, the pool's pages in `pool_pages`), and the counters the load report needs;
  `scheduler_hooks`: where the scheduler calls it (SGLang's `HookRegistry`);
- `http_ops`: what runs in the HTTP server process: routes on SGLang's FastAPI app, the chat
  template rendering of the OpenAI endpoint, the scheduler's published load snapshot, and the
  awaitable calls into the scheduler;
- `bench_rigs`: SGLang's cache classes built outside a server, for the benchmarks that time them;
- `checked_file_store`, `guarded_mooncake_store`: the pool backends SGLang loads through its `dynamic` storage
  backend (the default `file` pool and `mooncake`), which verify every page they read with `page_digest`.

Importing the package imports nothing; the modules import SGLang (`page_digest` only xxhash) and are imported by
the plug-in, or by SGLang's storage-backend factory, only inside SGLang's processes (and by the tests and the
benchmarks, in-process).
"""
