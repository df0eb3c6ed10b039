//! Sessions, KV cache, buckets, sampling and chat templates.
