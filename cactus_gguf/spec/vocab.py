"""Can this draft speculate for this verifier? Their tokenizers must agree id for id."""
from __future__ import annotations

from ..errors import InputError
from ..llama import Model

__all__ = ["VocabMismatchError", "check_vocab_compatible"]

# token attributes (llama.h enum llama_token_attr) that mark ids no text ever maps to
_ATTR_UNUSED = 1 << 1
_ATTR_UNDEFINED = 0


class VocabMismatchError(InputError):
    """Draft and verifier tokenize differently; speculation between them would be meaningless."""


def check_vocab_compatible(verifier: Model, draft: Model) -> None:
    """Refuse a draft whose tokenizer differs from the verifier's.

    Checked: tokenizer type; BOS / EOS / EOT ids and the add-BOS flag; the text of every id the two
    vocabularies share. Vocabularies of different sizes are accepted only when the extra ids at the
    end of the longer one are unused padding (e.g. 151,936 vs 152,064 in the Qwen2 family); the draft
    then never proposes an id the verifier lacks.

    Raises VocabMismatchError naming the first difference.
    """
    v, d = verifier.path.name, draft.path.name
    fix = "pick a draft from the verifier's model family"
    if verifier.vocab_type != draft.vocab_type:
        raise VocabMismatchError(
            f"draft {d} and verifier {v} use different tokenizer types "
            f"({draft.vocab_type} vs {verifier.vocab_type}): {fix}")
    for what in ("bos", "eos", "eot", "add_bos"):
        a, b = getattr(verifier, what), getattr(draft, what)
        if a != b:
            raise VocabMismatchError(f"draft {d} and verifier {v} disagree on {what} "
                                     f"(verifier {a}, draft {b}): {fix}")
    n_common = min(verifier.n_vocab, draft.n_vocab)
    for i in range(n_common):
        tv, td = verifier.token_text(i), draft.token_text(i)
        if tv != td:
            raise VocabMismatchError(
                f"draft {d} and verifier {v} have different vocabularies: token id {i} is "
                f"{tv.decode('utf-8', 'replace')!r} in the verifier and "
                f"{td.decode('utf-8', 'replace')!r} in the draft; {fix}")
    longer = verifier if verifier.n_vocab > draft.n_vocab else draft
    for i in range(n_common, longer.n_vocab):
        text = longer.token_text(i)
        padding = (longer.token_attr(i) in (_ATTR_UNUSED, _ATTR_UNDEFINED)
                   or text.startswith((b"[PAD", b"<|PAD", b"<pad")))
        if not padding:
            raise VocabMismatchError(
                f"vocabulary sizes differ (verifier {verifier.n_vocab}, draft {draft.n_vocab}) and "
                f"id {i} of {longer.path.name} ({text.decode('utf-8', 'replace')!r}) is a real "
                f"token: {fix}")
