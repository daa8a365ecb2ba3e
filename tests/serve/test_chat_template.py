"""Chat templates read from a checkpoint and rendered as transformers does; stop strings across tokens."""

from __future__ import annotations

import json

import pytest

from kern_run.serve.chat_template import ChatTemplate, load_chat_template
from kern_run.serve.errors import BadRequest
from kern_run.serve.stops import StopMatcher

QWEN_LIKE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
             "{% endif %}")


def _ckpt(tmp_path, **config):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_string_template_with_the_generation_prompt(tmp_path):
    t = load_chat_template(_ckpt(tmp_path, chat_template=QWEN_LIKE, eos_token="<|im_end|>"))
    msgs = [{"role": "user", "content": "hi"}]
    assert t.render(msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(msgs, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    assert t.eos_token == "<|im_end|>"


def test_a_list_of_named_templates_uses_default_and_tokens_may_be_objects(tmp_path):
    ckpt = _ckpt(tmp_path, chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default",
                                                                                 "template": "{{ bos_token }}D"}],
                 bos_token={"content": "<s>", "lstrip": False})
    assert load_chat_template(ckpt).render([]) == "<s>D"


def test_chat_template_jinja_beside_the_config_wins(tmp_path):
    ckpt = _ckpt(tmp_path, chat_template="config")
    (tmp_path / "chat_template.jinja").write_text("file")
    assert load_chat_template(ckpt).render([]) == "file"


def test_no_template(tmp_path):
    assert load_chat_template(_ckpt(tmp_path)) is None
    assert load_chat_template(tmp_path / "missing") is None


@pytest.mark.parametrize("value, needle", [
    ([{"name": "tool_use", "template": "T"}], 'a list of templates without a "default" one'),
    (7, "expected a string, got int"),
    ("{% for %}", "the template does not compile"),
])
def test_bad_templates_name_the_file(tmp_path, value, needle):
    with pytest.raises(ValueError) as err:
        load_chat_template(_ckpt(tmp_path, chat_template=value))
    assert "tokenizer_config.json: chat_template" in str(err.value) and needle in str(err.value)


def test_transformers_environment():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}"
                     "{% endfor %}|{{ extra }}")
    assert t.render([{"role": "user", "content": "héllo"}, {"role": "user", "content": "x"}], extra=3) == \
        '{"role": "user", "content": "héllo"}|3'
    with pytest.raises(BadRequest) as err:
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render([])
    assert err.value.code == "chat_template_refused" and "roles must alternate" in err.value.message
    with pytest.raises(BadRequest) as err:  # the sandbox refuses attribute tricks
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    assert err.value.code == "chat_template_error"


class Letters:
    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


def test_a_stop_string_spanning_tokens_never_reaches_the_output():
    m = StopMatcher(Letters(), ["cde"])
    got = [m.push(i) for i in (0, 1, 2, 3)]  # a b c d: "cd" held back
    assert got == [("", False), ("", False), ("a", False), ("b", False)]
    assert m.push(4) == ("", True)  # "cde" completed: the text ends before it


def test_held_text_is_released_when_it_cannot_match_or_at_the_end():
    m = StopMatcher(Letters(), ["cx"])
    assert [m.push(i) for i in (0, 2, 3)] == [("", False), ("a", False), ("c", False)]
    assert m.push(2, eos=True) == ("", False)
    assert m.flush() == ("d", False)
    plain = StopMatcher(Letters(), [])
    assert plain.push(0) == ("a", False)
