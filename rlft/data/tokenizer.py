"""The built-in character-level tokenizer.

One token per character: the four special tokens, the newline, and printable ASCII 32..126, so the
vocabulary has 100 entries. It is an ordinary `tokenizers` BPE model with no merges wrapped in
`transformers.PreTrainedTokenizerFast`, so `save_pretrained` writes a plain `tokenizer.json` that
`AutoTokenizer.from_pretrained(dir)` loads without `trust_remote_code`.

Encoding adds nothing: no BOS and no EOS are inserted, so `encode(s)` is exactly one id per character
of `s` (training code appends EOS itself). Decoding concatenates tokens with no separator, so
`decode(encode(s)) == s` for any text made of newlines and printable ASCII. Other characters map to
`<unk>`. There is no chat template; prompts use the plain template in `rlft.data.formatting`.
"""

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3
CHARACTERS = ["\n"] + [chr(code) for code in range(32, 127)]
DEFAULT_MAX_LENGTH = 512


def char_vocab() -> dict[str, int]:
    """Token → id: the special tokens first (`<pad>` is 0), then newline and printable ASCII."""
    return {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}


def build_char_tokenizer(model_max_length: int = DEFAULT_MAX_LENGTH) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer (see the module docstring for its guarantees)."""
    # A BPE model without merges splits every input into single characters; with no
    # pre-tokenizer, spaces and newlines are ordinary characters, and Fuse() joins tokens on decode.
    backend = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token=UNK))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        padding_side="right",
    )
