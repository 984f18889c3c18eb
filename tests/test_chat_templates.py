"""Chat templates other than the GGUF's and the thinking switch, as llama-server has them:
``--chat-template NAME|JINJA`` (a built-in template of llama.cpp by name, or Jinja text),
``-rea/--reasoning on|off|auto`` (the template's ``enable_thinking``), and an earlier turn's
reasoning (``reasoning_content``, Anthropic's ``thinking`` blocks) reaching the template. Prompts
are checked to the character."""
from __future__ import annotations

import datetime

import httpx
import pytest

from support.harness import assert_one_line_error, run_cli
from support.server import LiveServer
from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama

from cactus_gguf.errors import InputError
from cactus_gguf.options import LoadOptions
from cactus_gguf.prompting.templates import (apply_template, content_kinds, enable_thinking,
                                             has_thinking_switch)
from cactus_gguf.prompting.text import continued_text, render_chat

# Qwen 3's conventions, shortened: an earlier turn's reasoning in <think>, calls in <tool_call>,
# and an empty thought opened and closed when enable_thinking is false.
THINKING = (
    "{%- if tools %}<|im_start|>system\ntools: {{ tools | length }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{%- endif %}")
BOOK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def test_a_builtin_template_by_name_is_llama_cpps_own_formatter():
    assert apply_template("llama3", BOOK, bos="", eos="") == (
        "<|start_header_id|>system<|end_header_id|>\n\nBook<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nWhat is the best book<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\n")
    assert apply_template("command-r", BOOK, bos="", eos="", add_generation_prompt=False) == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Book<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
        "<|USER_TOKEN|>What is the best book<|END_OF_TURN_TOKEN|>")
    # a name is not Jinja text: "chatml" is the built-in ChatML, not the word
    assert apply_template("chatml", BOOK[1:], bos="", eos="") == (
        "<|im_start|>user\nWhat is the best book<|im_end|>\n<|im_start|>assistant\n")


def test_reasoning_sets_enable_thinking_where_the_template_has_the_switch():
    assert has_thinking_switch(THINKING)
    assert not has_thinking_switch(CHAT_TEMPLATE) and not has_thinking_switch("chatml")
    assert [enable_thinking(r, THINKING) for r in ("on", "off", "auto")] == [True, False, True]
    assert [enable_thinking(r, CHAT_TEMPLATE) for r in ("on", "off", "auto")] == [True, False, False]
    user = [{"role": "user", "content": "hi"}]
    assert apply_template(THINKING, user, bos="", eos="", enable_thinking=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think></think>")
    assert apply_template(THINKING, user, bos="", eos="", enable_thinking=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_and_reasoning_values_are_checked_before_any_model_loads():
    assert LoadOptions(chat_template="chatml").template == "chatml"
    assert LoadOptions(chat_template="This is not a chat template").template == \
        "This is not a chat template"  # Jinja text without markup: itself, as llama-server's
    assert LoadOptions(chat_template_file=THINKING).template == THINKING
    for given, words in (({"chat_template": "chatlm"}, "neither the name of a built-in"),
                         ({"chat_template": "{% if %}"}, "not a valid Jinja template"),
                         ({"chat_template": "chatml", "chat_template_file": THINKING},
                          "give one chat template"),
                         ({"reasoning": "maybe"}, "must be one of on, off, auto")):
        with pytest.raises(InputError, match=words):
            LoadOptions(**given)


def test_a_jinja_template_has_loop_controls_and_todays_date_as_llama_server_gives_them():
    t = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}"
         "{% endfor %} {{ date_string }} / {{ datetime }}")
    assert LoadOptions(chat_template_file=t).template == t  # {% break %} compiles
    today = datetime.date.today()
    assert apply_template(t, BOOK, bos="", eos="") == \
        f"Book {today:%d %b %Y} / {today:%b %d %Y}"  # e.g. "Book 07 Dec 2026 / Dec 07 2026"


def test_a_null_or_undefined_beside_a_string_joins_as_the_empty_string_as_llama_cpp():
    # Firefunction v2's template adds `functions` (llama-cpp-python gives it None) and, in
    # llama.cpp, anything no one defines: llama.cpp's Jinja engine reads the null as ""
    t = ("{{ 'Tools:' + functions + '.' }}{{ nothing + '!' }}{% for m in messages %}"
         "{{ ' ' + m.content }}{% endfor %} {{ [1] + [2] }}")
    assert apply_template(t, BOOK, bos="", eos="") == "Tools:.! Book What is the best book [1, 2]"
    with pytest.raises(TypeError):  # anything else added to a string still fails
        apply_template("{{ 'a' + 1 }}", BOOK, bos="", eos="")


# content read part by part when it is a list (Qwen 3.5's / Mistral's way), text otherwise
TYPED = ("{%- for m in messages %}[{{ m.role }}]"
         "{%- if m.content is string %}{{ m.content }}{% else %}"
         "{%- for p in m.content %}{% if p.type == 'text' %}<{{ p.text }}>{% endif %}{% endfor %}"
         "{%- endif %}{% endfor %}")
PARTS_ONLY = ("{%- for m in messages %}[{{ m.role }}]"
              "{%- for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}")
PARTS = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]


def test_text_parts_reach_a_template_as_it_reads_them_as_llama_server_gives_them():
    """llama.cpp's template capabilities: a template that reads typed content part by part gets
    the list, one that takes text gets the parts joined with a newline (printing the list as a
    whole is not reading it), one that takes only parts gets text as one part; a continued
    assistant message's parts are joined by a blank line."""
    assert content_kinds(TYPED) == (True, True)
    assert content_kinds(PARTS_ONLY) == (False, True)
    assert content_kinds(CHAT_TEMPLATE) == (True, False)
    assert content_kinds("{% for m in messages %}{{ m.content | tojson }}{% endfor %}") == \
        (True, False)
    assert content_kinds("llama3") == (True, False)
    chat = [{"role": "user", "content": PARTS}, {"role": "assistant", "content": "ok"}]
    assert render_chat(TYPED, chat, bos="", eos="") == "[user]<Wh><ill>[assistant]ok"
    assert render_chat(PARTS_ONLY, chat, bos="", eos="") == "[user]<Wh><ill>[assistant]<ok>"
    assert render_chat(CHAT_TEMPLATE, chat, bos="", eos="") == \
        "user: Wh\nill\nassistant: ok\nassistant:"
    assert render_chat("llama3", chat[:1], bos="", eos="").endswith("Wh\nill<|eot_id|>"
                                                                    "<|start_header_id|>assistant"
                                                                    "<|end_header_id|>\n\n")
    assert continued_text(PARTS) == "Wh\n\nill" and continued_text("Whill") == "Whill"
    assert continued_text(None) == ""
    with pytest.raises(InputError):
        render_chat(TYPED, [{"role": "user", "content": [{"type": "image_url"}]}], bos="", eos="")


@pytest.fixture(scope="module")
def ver(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("templates") / "ver.gguf", seed=11,
                       zero_output_rows=[EOS], chat_template=CHAT_TEMPLATE)


def post(server, path, body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_serve_renders_with_the_template_and_reasoning_it_was_given(ver, tmp_path):
    """-rea off and --chat-template-file: /apply-template and the token counts show the prompt a
    chat decodes, with the earlier turns' reasoning (OpenAI's reasoning_content, Anthropic's
    thinking blocks) inside it."""
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING)
    tool = {"type": "function", "function": {"name": "ls", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}}}}
    with LiveServer(ver, "-t", "1", "--method", "none", "-n", "2", "--chat-template-file",
                    template, "-rea", "off") as s:
        for tools in ({}, {"tools": []}):  # an empty list is no tools, as llama-server reads it
            r = post(s, "/apply-template", {"messages": [{"role": "user", "content": "hi"}],
                                            **tools})
            assert r.json() == {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>"
                                          "assistant\n<think></think>"}
            # a request's chat_template_kwargs win over --reasoning (llama-server's field)
            r = post(s, "/apply-template", {"messages": [{"role": "user", "content": "hi"}],
                                            "chat_template_kwargs": {"enable_thinking": True},
                                            **tools})
            assert r.json() == {"prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>"
                                          "assistant\n"}
        parts = [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]
        r = post(s, "/apply-template", {"messages": [{"role": "user", "content": parts}]})
        assert r.json()["prompt"].startswith("<|im_start|>user\nhi\nthere<|im_end|>")  # llama-server's join
        r = post(s, "/apply-template", {"messages": [{"role": "user", "content": "hi"}],
                                        "chat_template_kwargs": {"tools": []}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
        history = [{"role": "user", "content": "fix it"},
                   {"role": "assistant", "content": "", "reasoning_content": "look first",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {
                        "name": "ls", "arguments": "{\"path\": \".\"}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "main.py"}]
        thinking = {"chat_template_kwargs": {"enable_thinking": True}}  # the tools' path too
        r = post(s, "/apply-template", {"messages": history, "tools": [tool], **thinking})
        assert r.json()["prompt"].endswith("<|im_start|>assistant\n")
        r = post(s, "/apply-template", {"messages": history, "tools": [tool]})
        assert r.json()["prompt"] == (
            "<|im_start|>system\ntools: 1<|im_end|>\n<|im_start|>user\nfix it<|im_end|>\n"
            "<|im_start|>assistant\n<think>look first</think><tool_call>ls</tool_call><|im_end|>\n"
            "<|im_start|>tool\nmain.py<|im_end|>\n<|im_start|>assistant\n<think></think>")
        anthropic = [{"role": "user", "content": "fix it"},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": "look first", "signature": "s"},
                         {"type": "tool_use", "id": "c1", "name": "ls", "input": {"path": "."}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "c1", "content": "main.py"}]}]
        tools = [{"name": "ls", "input_schema": tool["function"]["parameters"]}]
        counts = [post(s, "/v1/messages/count_tokens", {
            "model": "m", "messages": ms, "tools": tools}).json()["input_tokens"]
            for ms in (anthropic, [anthropic[0], {**anthropic[1], "content": anthropic[1][
                "content"][1:]}, anthropic[2]])]
        assert counts[0] == counts[1] + len("<think>look first</think>")  # byte-level vocabulary


def test_serve_takes_a_builtin_template_by_name(ver):
    with LiveServer(ver, "-t", "1", "--method", "none", "-n", "2",
                    "--chat-template", "command-r") as s:
        r = post(s, "/apply-template", {"messages": [
            {"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]})
        assert r.json() == {"prompt": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test."
                                      "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
                                      "Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                                      "<|CHATBOT_TOKEN|>"}
        assert httpx.get(s.url + "/props").json()["chat_template"] == "command-r"
    r = run_cli("serve", ver, "--chat-template", "chatlm")
    assert_one_line_error(r, "--chat-template 'chatlm' is neither the name of a built-in")
    r = run_cli("serve", ver, "-rea", "maybe")
    assert r.returncode != 0 and "'maybe' is not one of 'on', 'off', 'auto'" in r.stderr
