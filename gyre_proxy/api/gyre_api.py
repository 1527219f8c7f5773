"""gyre's own endpoint beside the model APIs: ``POST /gyre/v1/evaluate``.

An execution (its API key) asks for an evaluation of an artifact it preserved; the answer is
JSON ``{"status", "score", "critique"}``. Errors are answered in the OpenAI shape, which the
command in the workspace prints as they are.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gyre_proxy.api.adapter import ApiSettings, authenticate, read_json
from gyre_proxy.api.errors import openai_error_response
from gyre_proxy.chat import EvaluationAsked, EvaluationGateway, KeyResolver
from gyre_proxy.exceptions import ApiError

ASK_DECODER = msgspec.json.Decoder(EvaluationAsked)


def routes(gateway: EvaluationGateway, keys: KeyResolver, settings: ApiSettings) -> list[Route]:
    async def evaluate(request: Request) -> Response:
        try:
            execution = await authenticate(request, keys)
            asked = await read_json(request, ASK_DECODER, settings)
            answer = await gateway.evaluate(execution, asked)
        except ApiError as exc:
            return openai_error_response(exc)
        return Response(msgspec.json.encode(answer), media_type="application/json")

    return [Route("/gyre/v1/evaluate", evaluate, methods=["POST"])]
