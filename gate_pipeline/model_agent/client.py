"""The official AsyncOpenAI client, building each chat-completions request once per shape, not per call.

Measured (benchmarks/bench_client_overhead.py): of the openai client's ~0.6 ms of CPU per request,
about 60 % went to `_build_request` (header merging, URL parsing and validation through httpx2),
and for `gate run` that work gives the same URL and headers on every request of a run: only the
body changes; `post` also spent ~50 us per call building its pydantic options from scratch.
`GateOpenAI` lets openai build a request once per shape (method, path, custom headers, timeout,
retry number, key, base URL) with its own `_build_request` and reuses that URL and those headers
for the next bodies; `post_bytes` copies one options object per shape. Everything else is the
client's own code: retries, timeouts, error mapping (APIStatusError, APITimeoutError...), auth.
A request the cache does not cover (JSON bodies, files, query params, an idempotency header,
cookies set by a server, a key provider, workload identity, a provider runtime or custom auth)
goes through openai as is.
"""
from __future__ import annotations

import httpx2
from openai import AsyncOpenAI
from openai._models import FinalRequestOptions

MAX_SHAPES = 64


class GateOpenAI(AsyncOpenAI):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._shapes: dict[tuple, tuple] = {}
        self._option_templates: dict[tuple, FinalRequestOptions] = {}

    @property
    def user_agent(self) -> str:
        return f"AsyncOpenAI/Python {self._version}"  # what the server sees is the stock client's

    def _plain(self, options) -> bool:
        """True when openai's request depends on the options only through the cache key."""
        return (isinstance(options.content, bytes) and options.json_data is None and options.extra_json is None
                and options.files is None and not options.params and self._idempotency_header is None
                and self._provider_runtime is None and self._api_key_provider is None
                and self._workload_identity_auth is None and self.custom_auth is None
                and not self._client.cookies.jar)

    def _build_request(self, options, *, retries_taken: int = 0) -> httpx2.Request:
        if not self._plain(options):
            return super()._build_request(options, retries_taken=retries_taken)
        headers = options.headers or {}
        key = (options.method, options.url, tuple(headers.items()) if isinstance(headers, dict) else repr(headers),
               repr(options.timeout), retries_taken, self.api_key, str(self.base_url))
        shape = self._shapes.get(key)
        if shape is None:
            template = super()._build_request(options.model_copy(update={"content": b""}),
                                              retries_taken=retries_taken)
            shape = (template.method, template.url,
                     httpx2.Headers([(k, v) for k, v in template.headers.raw if k.lower() != b"content-length"]),
                     template.extensions)
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
            self._shapes[key] = shape
        method, url, headers, extensions = shape
        headers = httpx2.Headers(headers)  # a copy; Content-Length last, as httpx2 puts it
        headers["Content-Length"] = str(len(options.content))
        request = httpx2.Request(method, url, headers=headers, stream=httpx2.ByteStream(options.content),
                                 extensions=extensions)
        request.read()
        return request

    async def post_bytes(self, path: str, content: bytes, options: dict) -> httpx2.Response:
        """`self.post(path, cast_to=httpx2.Response, content=content, options=options)`, the same
        request through the same `request` (retries, errors, timeouts), with the request options
        copied from one built per (path, options) instead of built anew by pydantic per call."""
        key = (path, repr(options))
        template = self._option_templates.get(key)
        if template is None:
            template = FinalRequestOptions.construct(method="post", url=path, json_data=None, content=b"",
                                                     files=None, **options)
            if len(self._option_templates) >= MAX_SHAPES:
                self._option_templates.clear()
            self._option_templates[key] = template
        return await self.request(httpx2.Response, template.model_copy(update={"content": content}))
