"""From a request to the prompt the model reads, and from its tokens back to text: chat templates
(templates.py: Jinja or llama.cpp's built-in ones by name, the thinking switch) and text
streaming (text.py: incremental UTF-8, stop strings, ``render_chat``), tool calls (toolcalls.py:
the template's ``tools`` prompt, the calls parsed out of the reply, their grammar) and
fill-in-the-middle prompts (fim.py).

Nothing is imported here: each module is imported where it is used (fim.py loads llama.cpp's
bindings, text.py is on the CLI's start-up path).
"""
