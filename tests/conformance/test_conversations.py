"""OpenAI's Conversations API (`client.conversations`) with the `openai` package, unmodified,
and responses made in a conversation, against the real SmolLM2-135M-Instruct model on sheaf: a
conversation is made, read, changed, listed a page at a time and removed; a response made in it
reads its items first, as if they had been sent again, and adds its input and output to it,
streamed or in the background too; what cannot be read or kept is refused by name. The OpenAI
Agents SDK keeps an agent's session in one (`OpenAIConversationsSession`), and runs an agent in
one (`conversation_id`)."""
import asyncio

import agents
import json
import urllib.request

import openai
import pytest

from conftest import link_gguf, start
from test_responses import finished


def texts(items):
    return [(i.role, i.content[0].text) for i in items]


def test_a_conversation_is_made_read_changed_listed_and_removed(client):
    made = client.conversations.create(
        metadata={"topic": "geography"},
        items=[{"role": "user", "content": "Hello."},
               {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi."}]}])
    assert made.object == "conversation" and made.id.startswith("conv_")
    assert made.metadata == {"topic": "geography"} and made.created_at > 0
    assert client.conversations.retrieve(made.id).metadata == {"topic": "geography"}
    changed = client.conversations.update(made.id, metadata={"topic": "history"})
    assert changed.metadata == {"topic": "history"}
    added = client.conversations.items.create(made.id, items=[
        {"role": "user", "content": f"Question {n}."} for n in range(3)])
    assert [i.content[0].text for i in added.data] == [f"Question {n}." for n in range(3)]
    assert all(i.id.startswith("msg") for i in added.data)
    # Newest first by default, oldest first asked; a page at a time after an item.
    listed = client.conversations.items.list(made.id)
    assert texts(listed.data) == texts(reversed(list(
        client.conversations.items.list(made.id, order="asc").data)))
    assert texts(client.conversations.items.list(made.id, order="asc").data) == [
        ("user", "Hello."), ("assistant", "Hi."),
        ("user", "Question 0."), ("user", "Question 1."), ("user", "Question 2.")]
    page = client.conversations.items.list(made.id, order="asc", limit=2)
    assert page.has_more and texts(page.data) == [("user", "Hello."), ("assistant", "Hi.")]
    rest = client.conversations.items.list(made.id, order="asc", limit=2, after=page.last_id)
    assert texts(rest.data) == [("user", "Question 0."), ("user", "Question 1.")]
    every = [i.id for i in client.conversations.items.list(made.id, order="asc", limit=100)]
    assert len(every) == 5 and len(set(every)) == 5
    # One item read and removed.
    one = client.conversations.items.retrieve(every[2], conversation_id=made.id)
    assert one.content[0].text == "Question 0."
    assert client.conversations.items.delete(every[2], conversation_id=made.id).id == made.id
    with pytest.raises(openai.NotFoundError) as gone:
        client.conversations.items.retrieve(every[2], conversation_id=made.id)
    assert "has no item" in str(gone.value)
    assert len(client.conversations.items.list(made.id).data) == 4
    deleted = client.conversations.delete(made.id)
    assert deleted.deleted is True and deleted.id == made.id
    with pytest.raises(openai.NotFoundError) as gone:
        client.conversations.retrieve(made.id)
    assert "no conversation" in str(gone.value)


def test_a_response_made_in_a_conversation_reads_it_and_adds_to_it(client):
    conversation = client.conversations.create(items=[
        {"role": "user", "content": "My name is Ada."},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Nice to meet you, Ada."}]}])
    asked = dict(model="smollm2", temperature=0, max_output_tokens=12)
    spelled_out = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "What is my name?"}]
    # llama.cpp's sums differ a little between a prompt read whole and one read after a kept
    # prefix, which can flip a greedy pick: the prompt is read once first, so that the two
    # compared are read alike, from the same kept prefix.
    client.responses.create(input=spelled_out, **asked)
    made_in = client.responses.create(conversation=conversation.id, input="What is my name?",
                                      **asked)
    sent_again = client.responses.create(input=spelled_out, **asked)
    assert made_in.output_text == sent_again.output_text
    assert made_in.usage.input_tokens == sent_again.usage.input_tokens
    assert made_in.conversation.id == conversation.id
    assert sent_again.conversation is None
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert texts(items) == [("user", "My name is Ada."),
                            ("assistant", "Nice to meet you, Ada."),
                            ("user", "What is my name?"),
                            ("assistant", made_in.output_text)]
    assert items[-1].id == made_in.output[0].id
    # The next response goes on from all of it; the `{"id": ...}` form names it too.
    then = client.responses.create(conversation={"id": conversation.id}, input="Thanks.",
                                   **asked)
    assert then.usage.input_tokens > made_in.usage.input_tokens + made_in.usage.output_tokens
    assert len(client.conversations.items.list(conversation.id).data) == 6


def test_streamed_and_background_responses_add_to_their_conversation(client):
    conversation = client.conversations.create()
    asked = dict(model="smollm2", temperature=0, max_output_tokens=8)
    completed = None
    for event in client.responses.create(conversation=conversation.id, input="Hello!",
                                         stream=True, **asked):
        if event.type in ("response.completed", "response.incomplete"):
            completed = event.response
            # Added before the stream says it has finished.
            items = client.conversations.items.list(conversation.id, order="asc").data
            assert texts(items)[-1] == ("assistant", completed.output_text)
    assert completed.conversation.id == conversation.id
    queued = client.responses.create(conversation=conversation.id, input="Bye!",
                                     background=True, **asked)
    assert queued.conversation.id == conversation.id
    done, _ = finished(client, queued.id)
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert texts(items) == [("user", "Hello!"), ("assistant", completed.output_text),
                            ("user", "Bye!"), ("assistant", done.output_text)]


@pytest.mark.parametrize("call, says", [
    (lambda c: c.conversations.create(items=[{"role": "user", "content": "x"}] * 21),
     "at most 20"),
    (lambda c: c.conversations.create(items=[{"type": "reasoning", "summary": []}]),
     "items: input[0].type"),
    (lambda c: c.conversations.create(
        items=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     "text parts"),
    (lambda c: c.conversations.create(metadata={"k": "v" * 513}), "at most 512"),
    (lambda c: c.conversations.create(metadata={f"k{n}": "v" for n in range(17)}),
     "at most 16 keys"),
    (lambda c: c.conversations.create(extra_body={"name": "x"}), "name: not a field"),
    (lambda c: c.responses.create(model="smollm2", input="hi", conversation=7),
     "conversation: its id"),
])
def test_what_cannot_be_read_or_kept_is_refused_by_name(client, call, says):
    with pytest.raises(openai.BadRequestError) as refused:
        call(client)
    assert says in str(refused.value), refused.value


def test_a_conversation_is_named_alone_and_must_be_kept(client):
    conversation = client.conversations.create()
    earlier = client.responses.create(model="smollm2", input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="smollm2", input="hi", conversation=conversation.id,
                                previous_response_id=earlier.id)
    assert "one or the other" in str(refused.value), refused.value
    for call in (lambda: client.responses.create(model="smollm2", input="hi",
                                                 conversation="conv_none"),
                 lambda: client.conversations.items.list("conv_none"),
                 lambda: client.conversations.items.create("conv_none", items=[
                     {"role": "user", "content": "x"}]),
                 lambda: client.conversations.update("conv_none", metadata={}),
                 lambda: client.conversations.delete("conv_none")):
        with pytest.raises(openai.NotFoundError) as gone:
            call()
        assert "no conversation 'conv_none' is kept" in str(gone.value), gone.value


def test_the_agents_sdk_keeps_its_session_and_runs_in_a_conversation(tmp_path):
    # A server of its own: a greedy answer depends on which of its prompt's tokens earlier
    # requests left in the prefix cache (cells computed with the whole prompt and cells read
    # back differ in the last bits), so it is the same run to run only on a fresh server.
    link_gguf(tmp_path)
    for served in start(tmp_path):
        agents_in_a_conversation(served)


def agents_in_a_conversation(server):
    agents.set_tracing_disabled(True)
    sync = openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="not-needed")
    conversation = sync.conversations.create()

    async def run():
        client = openai.AsyncOpenAI(base_url=f"http://{server.http}/v1", api_key="not-needed")
        # Greedy, each answer ends within the limit (an incomplete answer fails a run).
        agent = agents.Agent(
            name="assistant", instructions="Reply with one word.",
            model=agents.OpenAIResponsesModel(model="smollm2", openai_client=client),
            model_settings=agents.ModelSettings(temperature=0, max_tokens=400))
        session = agents.OpenAIConversationsSession(openai_client=client)
        kept = [await agents.Runner.run(agent, "My name is Ada.", session=session),
                await agents.Runner.run(agent, "What is my name?", session=session)]
        items = await session.get_items()
        popped = await session.pop_item()
        left = await session.get_items()
        session_id = await session._get_session_id()
        await session.clear_session()
        # Run in a conversation: each response is made in it.
        made_in = [await agents.Runner.run(agent, "My name is Ada.",
                                           conversation_id=conversation.id),
                   await agents.Runner.run(agent, "What is my name?",
                                           conversation_id=conversation.id)]
        await client.close()
        return kept, items, popped, left, session_id, made_in

    kept, items, popped, left, session_id, made_in = asyncio.run(run())
    assert [(i["role"], i["content"][0]["text"]) for i in items] == [
        ("user", "My name is Ada."), ("assistant", kept[0].final_output),
        ("user", "What is my name?"), ("assistant", kept[1].final_output)]
    assert popped["content"][0]["text"] == kept[1].final_output and left == items[:3]
    with pytest.raises(openai.NotFoundError):
        sync.conversations.retrieve(session_id)
    # The second run read the first's items from the conversation, not from its input.
    first, second = (r.raw_responses[0].usage for r in made_in)
    assert second.input_tokens > first.input_tokens + first.output_tokens
    assert texts(sync.conversations.items.list(conversation.id, order="asc").data) == [
        ("user", "My name is Ada."), ("assistant", made_in[0].final_output),
        ("user", "What is my name?"), ("assistant", made_in[1].final_output)]


def test_a_server_that_keeps_nothing_keeps_no_conversations(tmp_path):
    link_gguf(tmp_path)
    for served in start(tmp_path, "--responses-store-mib", "0"):
        client = openai.OpenAI(base_url=f"http://{served.http}/v1", api_key="not-needed")
        with pytest.raises(openai.BadRequestError) as refused:
            client.conversations.create()
        assert "keeps no conversations" in str(refused.value), refused.value
        with pytest.raises(openai.NotFoundError) as gone:
            client.responses.create(model="smollm2", input="hi", conversation="conv_1")
        assert "--responses-store-mib 0" in str(gone.value), gone.value


def test_truncation_auto_drops_a_long_conversation_s_oldest_turns_to_fit(tmp_path):
    link_gguf(tmp_path)
    # A small context, so that a conversation outgrows it quickly.
    (tmp_path / "smollm2" / "config.yaml").write_text("generation: {n_ctx: 512}\n")
    for served in start(tmp_path):
        client = openai.OpenAI(base_url=f"http://{served.http}/v1", api_key="not-needed")
        asked = json.dumps({"model": "smollm2",
                            "messages": [{"role": "user", "content": "99 " + "word " * 50}]})
        said = json.load(urllib.request.urlopen(urllib.request.Request(
            f"http://{served.http}/tokenize", data=asked.encode(),
            headers={"Content-Type": "application/json"}), timeout=30))
        context, turn = said["max_model_len"], said["count"]
        assert context == 512
        # Turns of ~50 tokens each, half as many again as the context holds.
        turns = context * 3 // 2 // turn + 1
        conversation = client.conversations.create(items=[
            {"role": "user" if n % 2 == 0 else "assistant", "content": f"{n} " + "word " * 50}
            for n in range(turns)])
        asked = dict(model="smollm2", conversation=conversation.id, temperature=0,
                     input="Say hello.", max_output_tokens=16)
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(**asked)
        assert "context holds 512 tokens" in str(refused.value), refused.value
        assert refused.value.code == "context_length_exceeded", refused.value
        fitted = client.responses.create(truncation="auto", **asked)
        assert fitted.truncation == "auto" and fitted.output_text
        used = fitted.usage.input_tokens
        # It fits with room for the answer, and no more turns went than it took.
        assert context - 16 - 2 * turn < used <= context - 16, (used, context, turn)
        # Without a limit of its own, the answer is left a quarter of the context.
        del asked["max_output_tokens"]
        quarter = client.responses.create(truncation="auto", **asked)
        assert context * 3 // 4 - 2 * turn < quarter.usage.input_tokens <= context * 3 // 4
        # The conversation keeps every item; only what the model read was cut.
        kept = client.conversations.items.list(conversation.id, limit=100).data
        assert len(kept) == turns + 4
