"""SGLang internals for the advisory-prefetch features, pinned to sglang 0.5.23 like `sglang_internals`.

`sglang_ext.sglang_internals` (CPU patches, the info route, the tool parser) and this package are
the one place that references SGLang's internal modules; it was split along the process seam:

- `ipc`: the request/reply types the HTTP process and the scheduler exchange over SGLang's own
  ZMQ channels (registered with its msgpack codec), and the hooks that install them;
- `scheduler_ops`: what runs on the scheduler's thread: prefetch from the L3 pool into host and
  device memory with UnifiedRadixCache's own machinery, and the counters the load report needs;
  `scheduler_hooks`: where the scheduler calls it (SGLang's `HookRegistry`);
- `http_ops`: what runs in the HTTP server process: routes on SGLang's FastAPI app, the chat
  template rendering of the OpenAI endpoint, the scheduler's published load snapshot, and the
  awaitable calls into the scheduler;
- `checked_file_store`, `guarded_mooncake_store`: the pool backends SGLang loads through its `dynamic` storage
  backend (the default `file` pool and `mooncake`), which verify every page they read with `page_digest`.

Importing the package imports nothing; the modules import SGLang (`page_digest` only xxhash) and are imported by
the plug-in, or by SGLang's storage-backend factory, only inside SGLang's processes (and by the tests and the
pool benchmark, in-process).
"""
