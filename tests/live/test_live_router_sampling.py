"""The router service refuses, with 400 and before allocating anything for the request, sampling
parameters SGLang could not serve (issue 41, point 9): max_new_tokens 2**33 was a 500 (a reply
buffer of that size at dispatch), NaN or 1e400 temperatures were accepted. The router is never asked to route such a request."""

from __future__ import annotations

import aiohttp
import pytest

from live_helpers import FakeWorker, RecordingRouter, run_async
from test_live_router_service import _service

BAD = [
    (b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8589934592}}', "max_new_tokens must be <="),
    (b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2147483647}}', "max_new_tokens must be <="),
    (b'{"input_ids": [1, 2, 3], "sampling_params": {"temperature": NaN}}', "temperature must be a finite number"),
    (b'{"input_ids": [1, 2, 3], "sampling_params": {"temperature": 1e400}}', "temperature must be a finite number"),
    (b'{"input_ids": [1, 2, 3], "sampling_params": {"temperature": -1}}', "temperature must be a number >= 0"),
    (b'{"input_ids": [1, 2, 3], "sampling_params": {"top_p": -Infinity}}', "top_p must be a finite number"),
]


@pytest.mark.parametrize("body,fragment", BAD)
def test_bad_sampling_parameters_are_400_before_routing(body, fragment):
    async def main():
        w = FakeWorker(lambda b: [])
        await w.start()
        router = RecordingRouter()
        svc = _service(router, [w.url])
        port = await svc.start()
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(f"http://127.0.0.1:{port}/generate", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    return r.status, await r.json(), router, svc.stats()
        finally:
            await svc.stop()
            await w.stop()

    status, reply, router, stats = run_async(main(), 30)
    assert status == 400 and fragment in reply["error"]["message"], reply
    assert stats["rejected"] == 1 and router.selected == []


def test_the_bound_leaves_real_requests_alone():
    from repro.backends.sglang.router_service.parsing import MAX_NEW_TOKENS_LIMIT, check_sampling

    check_sampling({"input_ids": [1], "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS_LIMIT, "temperature": 0.0}})
    check_sampling({"text": "hi", "sampling_params": {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 128}})
