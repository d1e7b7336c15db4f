"""A Hugging Face tokenizer directory that counts exactly as the fake vLLM does (one token per
whitespace-separated word; chat template ``<s> <|role|> content ... <|assistant|>``), for the
profile's ``model.tokenizer`` where the server has no ``/tokenize`` (KServe's Hugging Face
runtime). Built with ``tokenizers`` (WordLevel + whitespace split) and saved with transformers."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = ("{{ '<s>' }}{% for m in messages %} {{ '<|' + m['role'] + '|>' }} {{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %} {{ '<|assistant|>' }}{% endif %}")


def build(directory: Path) -> Path:
    """Write the tokenizer into ``directory`` (created) and return it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<|system|>": 3, "<|user|>": 4, "<|assistant|>": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    return directory
