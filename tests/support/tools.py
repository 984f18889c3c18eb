"""The tool-call fixtures: three chat templates with tools (Hermes's, Llama 3.1's and Command
R7B's conventions, shortened) and two tools with their parameter schemas."""
from __future__ import annotations

# A Hermes-style template (Qwen 2.5's conventions, shortened): tools in a system turn, calls in
# <tool_call> tags, results in <tool_response>.
HERMES_TEMPLATE = (
    "{%- if tools %}system: You may call these tools:{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\nCall one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call>\n"
    "{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}user: <tool_response>\n{{ m.content }}\n</tool_response>\n"
    "{%- elif m.tool_calls %}assistant:{% for c in m.tool_calls %}\n<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}\n"
    "{%- else %}{{ m.role }}: {{ m.content }}\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
# Llama 3.1's conventions, shortened: header tokens, the tools in the user turn, a JSON reply.
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if tools and loop.last %}Given the functions {{ tools | tojson }}, reply with "
    "{\"name\": function name, \"parameters\": dictionary of arguments}.\n{% endif %}"
    "{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
# Command R7B's conventions, shortened: the plan, the calls in one action list (numbered by the
# template), the answer, and the results in a system turn.
COMMAND_R7B_TEMPLATE = (
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{% if tools %}Plan in <|START_THINKING|>, call in "
    "<|START_ACTION|>, answer in <|START_RESPONSE|>.\n{% for t in tools %}"
    "{{ t.function | tojson }}\n{% endfor %}{% endif %}<|END_OF_TURN_TOKEN|>"
    "{%- set n = namespace(i=0) %}{%- for m in messages %}"
    "{%- if m.role == 'user' %}<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{{ m.content }}"
    "<|END_OF_TURN_TOKEN|>"
    "{%- elif m.role == 'assistant' %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% if m.tool_calls %}"
    "<|START_THINKING|>{{ m.reasoning_content }}<|END_THINKING|><|START_ACTION|>["
    "{% for c in m.tool_calls %}{\"tool_call_id\": \"{{ n.i }}\", \"tool_name\": "
    "\"{{ c.function.name }}\", \"parameters\": {{ c.function.arguments | tojson }}}"
    "{% if not loop.last %}, {% endif %}{% set n.i = n.i + 1 %}{% endfor %}]<|END_ACTION|>"
    "{% else %}<|START_RESPONSE|>{{ m.content }}<|END_RESPONSE|>{% endif %}<|END_OF_TURN_TOKEN|>"
    "{%- elif m.role == 'tool' %}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TOOL_RESULT|>"
    "{{ m.content }}<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>"
    "{%- endif %}{%- endfor %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")

UNIT = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "loud": {"type": "boolean"}},
        "required": ["unit", "loud"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "set_unit", "description": "units",
                                           "parameters": UNIT}},
         {"type": "function", "function": {"name": "beep", "parameters": {
             "type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"],
             "additionalProperties": False}}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
