"""A character-level tokenizer for the built-in arithmetic demo.

Every character is one token, so token counts equal character counts (plus EOS), which keeps the
demo's length-biased proxy easy to reason about. The vocabulary is the four special tokens plus
exactly the characters the task writes: ``Q:23+45-7=?A:#### 61</s>``. Anything else maps to
``<unk>``.

Special tokens: ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2, ``<unk>`` = 3. No post-processor is
installed, so ``tokenizer(text)`` adds NO BOS/EOS token: the chat template writes everything the
model sees (``A:`` + answer + ``</s>`` for SFT targets), and a prompt encodes the same whether or
not ``add_special_tokens`` is set. Padding is on the left for batched generation.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

# Digits, the operators and markers of `Q:23+45-7=?A:#### 61`, and the space that separates a
# packed continuation (`#### 61 Q:...`). `#` must be present or `####` becomes unk.
TASK_CHARACTERS: tuple[str, ...] = (*"0123456789", "+", "-", "=", "?", "#", ":", "Q", "A", " ")

# `Q:` before a user turn, `A:` before an assistant turn; an assistant turn ends with EOS so SFT
# teaches the model to stop. Other roles are refused rather than silently dropped.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}Q:{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}A:{{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('char tokenizer: unsupported role ' + message['role']) }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def char_vocab() -> dict[str, int]:
    """Return the token -> id map: the specials first (pad = 0), then the task characters."""
    return {token: i for i, token in enumerate((*SPECIAL_TOKENS, *TASK_CHARACTERS))}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the demo's character-level tokenizer (23 tokens), ready for `save_pretrained`."""
    backend = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK_TOKEN))
    # `[\s\S]` (not `.`) so newlines are split too and map to unk instead of merging.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins tokens with no separator; the default decoder would put spaces between them.
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        # The default clean-up would rewrite spaces before punctuation and break round trips.
        clean_up_tokenization_spaces=False,
    )
