"""The checkpoint's chat template (tokenizer_config.json `chat_template`), rendered the way transformers does.

As transformers' `apply_chat_template`: a jinja2 `ImmutableSandboxedEnvironment` with `trim_blocks`,
`lstrip_blocks` and the `loopcontrols` extension; globals `raise_exception(message)` (the template refuses a
conversation: a 400 naming the message) and `strftime_now(format)`; a `tojson` filter that keeps non-ASCII
text; variables `messages` (dicts of role / content), `add_generation_prompt`, `bos_token`, `eos_token`, plus
any `chat_template_kwargs` of the request. The template is read from `chat_template.jinja` beside the config
when present (newer checkpoints), else the config's `chat_template` (a string, or a list of named templates:
"default" is used).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import BadRequest


class TemplateRefusal(Exception):
    """What the template's `raise_exception(message)` raises."""


def _raise_exception(message: str) -> None:
    raise TemplateRefusal(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _token_text(value: Any) -> str:
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class ChatTemplate:
    """A compiled chat template. `render(messages, add_generation_prompt, **kwargs) -> str`.

    Raises BadRequest (param `messages`) when the template refuses the conversation or fails on it."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template_error = TemplateError
        self.source = source
        self.template = env.from_string(source)
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        try:
            return self.template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        except TemplateRefusal as exc:
            raise BadRequest(f"the chat template refused the conversation: {exc}", param="messages",
                             code="chat_template_refused") from None
        except (self._template_error, TypeError, ValueError, KeyError, IndexError) as exc:
            raise BadRequest(f"the chat template failed on these messages: {type(exc).__name__}: {exc}",
                             param="messages", code="chat_template_error") from None


def load_chat_template(checkpoint_dir: Path) -> ChatTemplate | None:
    """The chat template of a checkpoint directory, or None when it has none. Raises ValueError naming the file
    when tokenizer_config.json is unreadable or its `chat_template` is neither a string nor a list of
    {name, template} objects, or the template does not compile."""
    from jinja2 import TemplateSyntaxError

    config_path = checkpoint_dir / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{config_path}: {exc}") from None
    jinja_path = checkpoint_dir / "chat_template.jinja"
    source: Any = jinja_path.read_text(encoding="utf-8") if jinja_path.is_file() else config.get("chat_template")
    where = str(jinja_path) if jinja_path.is_file() else f"{config_path}: chat_template"
    if source is None:
        return None
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
        if source is None:
            raise ValueError(f"{where}: a list of templates without a \"default\" one ({sorted(map(str, named))})")
    if not isinstance(source, str):
        raise ValueError(f"{where}: expected a string, got {type(source).__name__}")
    try:
        return ChatTemplate(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))
    except TemplateSyntaxError as exc:
        raise ValueError(f"{where}: the template does not compile: {exc}") from None
