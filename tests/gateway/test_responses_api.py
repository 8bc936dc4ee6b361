"""`/v1/responses` through the real `openai` package, against the real gateway on a real socket (uvicorn), with a
fake worker (the gateway's own logic is what is tested: the chain as a session, the translation, the events)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from sessiongate.benchmarks.fake_worker import FakeWorkerBehaviour, create_fake_worker
from sessiongate.gateway.app import create_app
from sessiongate.gateway.server_protocol import HttpProtocol
from sessiongate.gateway.settings import GatewaySettings
from tests.gateway.conftest import served

pytestmark = pytest.mark.anyio

ADMIN_KEY = "admin-secret"
CLIENT_KEY = "sk-default-tenant"
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}


@pytest.fixture
async def gateway_url(tmp_path: Path) -> AsyncIterator[str]:
    async with served(create_fake_worker(FakeWorkerBehaviour()), http=HttpProtocol, lifespan="on") as worker_url:
        settings = GatewaySettings(
            api_key=CLIENT_KEY,
            admin_key=ADMIN_KEY,
            workers=(worker_url,),
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        )
        async with served(create_app(settings), http=HttpProtocol, lifespan="on") as url:
            yield url


@pytest.fixture
async def clients() -> AsyncIterator[list[openai.AsyncOpenAI]]:
    made: list[openai.AsyncOpenAI] = []
    yield made
    for client in made:
        await client.close()


@pytest.fixture
def make_client(clients: list[openai.AsyncOpenAI]) -> Callable[..., openai.AsyncOpenAI]:
    def make(url: str, key: str = CLIENT_KEY) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0))
        return clients[-1]

    return make


async def _turns(url: str, session_id: str, key: str | None = None) -> list[dict[str, Any]]:
    headers = {"authorization": f"Bearer {key or CLIENT_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as http:
        return list((await http.get(f"/v1/sessions/{session_id}/turns")).json()["data"])


async def test_a_chain_is_one_session_and_its_second_turn_is_a_cache_hit(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    client = make_client(gateway_url)
    first = await client.responses.create(model="m", instructions="Be brief.", input="hello there", store=True)
    assert first.object == "response"
    assert first.status == "completed"
    assert first.output_text == "echo: hello there"
    second = await client.responses.create(
        model="m", instructions="Be brief.", input="and again", previous_response_id=first.id
    )
    assert second.output_text == "echo: and again"
    assert second.previous_response_id == first.id
    assert second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens > 0
    session_id = second.model_extra["sessiongate"]["session_id"]  # type: ignore[index]
    assert session_id == first.model_extra["sessiongate"]["session_id"]  # type: ignore[index]
    turns = await _turns(gateway_url, session_id)
    assert [t["seq"] for t in turns] == [1, 2]
    # The second turn extends the first: only its new message is stored, no context reset.
    assert turns[1]["context_reset"] is False
    assert turns[1]["input_messages"] == [{"role": "user", "content": "and again"}]
    assert [t["session_source"] for t in turns] == ["new", "response"]
    assert turns[0]["input_messages"][0] == {"role": "system", "content": "Be brief."}


async def test_sync_client_and_retrieve_delete_and_input_items(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    def run() -> None:
        with openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=CLIENT_KEY, max_retries=0) as client:
            check(client)

    def check(client: openai.OpenAI) -> None:
        created = client.responses.create(
            model="m",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "one two"}]}],
            metadata={"k": "v"},
        )
        assert created.output_text == "echo: one two"
        fetched = client.responses.retrieve(created.id)
        assert fetched.id == created.id
        assert fetched.output_text == "echo: one two"
        assert fetched.metadata == {"k": "v"}
        items = client.responses.input_items.list(created.id)
        assert [item.type for item in items.data] == ["message"]
        assert items.data[0].content[0].text == "one two"  # type: ignore[union-attr]
        client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(created.id)

    await anyio.to_thread.run_sync(run)


async def test_streamed_text_follows_the_documented_event_sequence(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    client = make_client(gateway_url)
    stream = await client.responses.create(model="m", input="a b c", stream=True)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "echo: a b c"
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == "echo: a b c"
    assert completed.usage.output_tokens > 0
    # The streamed response is stored as it ended, and continues its chain.
    nxt = await client.responses.create(model="m", input="d", previous_response_id=completed.id)
    assert nxt.usage is not None
    assert nxt.usage.input_tokens_details.cached_tokens > 0
    fetched = await client.responses.retrieve(completed.id)
    assert fetched.output_text == "echo: a b c"


async def test_function_calls_and_their_outputs_continue_the_session(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    client = make_client(gateway_url)
    asked = await client.responses.create(model="m", input="look up x", tools=[TOOL], tool_choice="required")
    calls = [item for item in asked.output if item.type == "function_call"]
    assert len(calls) == 1
    assert calls[0].name == "lookup"
    assert calls[0].arguments == '{"q":"x"}'
    answered = await client.responses.create(
        model="m",
        previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "x is a letter"}],
        tools=[TOOL],
    )
    assert answered.output_text == "echo: x is a letter"
    session_id = answered.model_extra["sessiongate"]["session_id"]  # type: ignore[index]
    turns = await _turns(gateway_url, session_id)
    assert turns[1]["context_reset"] is False
    assert turns[1]["input_messages"] == [
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "x is a letter"}
    ]


async def test_streamed_function_call_arguments(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    client = make_client(gateway_url)
    stream = await client.responses.create(
        model="m", input="look up", tools=[TOOL], tool_choice={"type": "function", "name": "lookup"}, stream=True
    )
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done.arguments == deltas == '{"q":"x"}'
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output[0].type == "function_call"
    assert final.output[0].call_id.startswith("call_")


async def test_an_unknown_or_another_tenants_previous_response_is_the_same_404(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    async with httpx.AsyncClient(base_url=gateway_url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        key = (await admin.post("/v1/admin/keys", json={"tenant": "acme", "name": "t"})).json()["key"]
    mine = await make_client(gateway_url).responses.create(model="m", input="secret")
    other = make_client(gateway_url, key)
    with pytest.raises(openai.NotFoundError) as theirs:
        await other.responses.create(model="m", input="x", previous_response_id=mine.id)
    with pytest.raises(openai.NotFoundError) as unknown:
        await other.responses.create(model="m", input="x", previous_response_id="resp_doesnotexist")
    assert theirs.value.body["code"] == unknown.value.body["code"] == "response_not_found"  # type: ignore[index]
    assert theirs.value.body["message"].replace(mine.id, "X") == unknown.value.body["message"].replace(  # type: ignore[index]
        "resp_doesnotexist", "X"
    )
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.delete(mine.id)
    with pytest.raises(openai.BadRequestError):
        await other.responses.create(model="m", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]


async def test_full_input_without_previous_response_id_is_inferred(
    gateway_url: str, make_client: Callable[..., openai.AsyncOpenAI]
) -> None:
    """What the Agents SDK sends by default: the whole history as input items, no `previous_response_id`. The
    chain's turns are still one session: the gateway infers it from the stored context the input extends."""
    client = make_client(gateway_url)
    first = await client.responses.create(model="m", instructions="Be brief.", input="tell me")
    history: list[Any] = [
        {"role": "user", "content": "tell me"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "more"},
    ]
    second = await client.responses.create(model="m", instructions="Be brief.", input=history)
    session_id = first.model_extra["sessiongate"]["session_id"]  # type: ignore[index]
    assert second.model_extra["sessiongate"]["session_id"] == session_id  # type: ignore[index]
    turns = await _turns(gateway_url, session_id)
    assert [t["session_source"] for t in turns] == ["new", "inferred"]
    assert turns[1]["input_messages"] == [{"role": "user", "content": "more"}]
