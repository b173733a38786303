"""padfree.generation: encoder-decoder generation (Marian, M2M100/NLLB, BART, mBART) with greedy, beam
search and sampling, on packed sources and a beam-indirected K/V cache; HF generate's interface.

    gen = padfree.torch.from_hf(seq2seq_model, dtype=torch.float16)    # -> Seq2SeqGenerator
    sequences = gen.generate(input_ids, attention_mask, num_beams=4, max_new_tokens=64)

Modules, one job each: models (families, config checks), weights (extraction), options (HF's option
merge, refusals), inputs (source validation, memory check), reference_ops (the decoder kernel
contract in torch), dispatch (kernel or reference, the one place), encoder, decoder (one step),
processors (logits processors as id lists), beam_search, sampling, generator (the public object).
docs/GENERATION.md has the design rules.
"""
from .generator import Seq2SeqGenerator  # noqa: F401
from .models import FAMILIES, UnsupportedModelError  # noqa: F401
from .options import GenerationOptions, UnsupportedOptionError  # noqa: F401
