"""Seq2SeqGenerator: the object padfree.torch.from_hf returns for an encoder-decoder model."""
from __future__ import annotations

import copy
import logging
from collections import OrderedDict

import torch

from ..ops._tensors import InputError
from ..torch.gemm_tuning import GEMM_SEARCHES
from . import inputs
from .dispatch import DecoderOps
from .encoder import PackedSources, encode
from .models import detect_family, validate_config
from .options import GenerationOptions, resolve_options
from .runner import Runner
from .sampling import make_generator
from .weights import Seq2SeqWeights, extract, pad_output_projection

__all__ = ["Seq2SeqGenerator", "decode", "hf_output"]

log = logging.getLogger(__name__)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Seq2SeqGenerator:
    """Encoder-decoder generation (Marian, M2M100/NLLB, BART, mBART) on packed sources.

        gen = padfree.torch.from_hf(model, dtype=torch.float16)          # model: e.g. MarianMTModel
        out = gen.generate(input_ids, attention_mask, num_beams=4, max_new_tokens=64)
        out = gen.generate([[12, 7, 0], [5, 0]], num_beams=4, return_dict_in_generate=True, output_scores=True)

    generate() reads the model's generation_config and HF's option names and returns what HF's
    generate returns (a LongTensor of sequences, or with return_dict_in_generate HF's output class with
    `sequences` and, for beam search with output_scores, `sequences_scores`; per-step `scores` are not
    produced). Options it does not implement raise UnsupportedOptionError naming them. The model runs
    as in eval mode (no dropout), whatever its training flag.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.float16,
                 device: str | torch.device | None = None, *, force_reference_ops: bool = False,
                 use_graphs: bool = True, max_graphs: int = 4, gemm_search: str = "heuristic"):
        if dtype not in _DTYPES:
            raise InputError(f"dtype: expected one of {', '.join(map(str, _DTYPES))}, got {dtype}")
        if gemm_search not in GEMM_SEARCHES:
            raise InputError(f"gemm_search: expected one of {', '.join(GEMM_SEARCHES)}, got {gemm_search!r}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.spec = detect_family(model)
        validate_config(model.config, self.spec)
        self.config = copy.deepcopy(model.config)
        self.generation_config = copy.deepcopy(model.generation_config)
        self.device, self.dtype = device, dtype
        self.weights: Seq2SeqWeights = extract(model, self.spec, dtype, device)
        if device.type == "cuda":
            pad_output_projection(self.weights)     # an aligned logits GEMM (the CPU keeps the exact vocabulary)
        self.ops = DecoderOps(device, self.weights.encoder.head_dim, force_reference=force_reference_ops)
        # use_graphs: on CUDA each decode step is one CUDA-graph replay (runner.py); False runs the same
        # step eagerly. max_graphs: decode states (buffers + graph) kept per shape bucket, LRU.
        # gemm_search: how a bucket's first step times cuBLASLt's configurations for the output
        # projection's GEMM where one runs it (Decoder._output_gemm; "none": torch's call, untimed).
        self.runner = Runner(self.weights, self.ops, device, use_graphs=use_graphs, max_states=max_graphs,
                             gemm_search=gemm_search)
        self._resolved: OrderedDict[tuple, tuple[dict, GenerationOptions]] = OrderedDict()
        self._device_packer = inputs.DevicePacker(self.weights, device) \
            if device.type == "cuda" and not force_reference_ops else None
        # the model's own generation_config is checked at load: an option it carries that padfree does not
        # implement fails here, naming it, rather than at the first generate()
        self.resolve()
        if model.training:
            log.warning("padfree.generation: %s is in training mode; padfree generates as in eval mode (no "
                        "dropout), which HF's generate on this model would not", type(model).__name__)

    @property
    def use_graphs(self) -> bool:
        return self.runner.use_graphs

    @use_graphs.setter
    def use_graphs(self, value: bool) -> None:
        self.runner.use_graphs = bool(value)

    def __repr__(self) -> str:
        w = self.weights
        return (f"Seq2SeqGenerator({self.spec.hf_class}, {len(w.encoder.layers)}+{len(w.decoder.layers)} layers, "
                f"hidden {w.decoder.hidden}, vocab {w.target_vocab_size}, {self.dtype}, {self.device}; "
                f"ops: {self.ops.describe()})")

    def resolve(self, generation_config=None, **kwargs) -> GenerationOptions:
        """The options a generate() call with these arguments would run with (HF's merge, padfree's checks).

        Without an explicit generation_config the result is kept per set of keywords (their values and
        types; an LRU of 16) for as long as this generator's own generation_config holds the values it
        held then (compared with a deep copy taken then): HF's merge deep-copies the configs, ~0.3 ms of
        host time a call on the device machines' hosts, before anything reaches the GPU."""
        key = _keywords_key(kwargs) if generation_config is None else None
        if key is not None:
            kept = self._resolved.get(key)
            if kept is not None and kept[0] == vars(self.generation_config):
                self._resolved.move_to_end(key)
                return kept[1]
        options = resolve_options(self.generation_config, self.config, self.weights.target_vocab_size,
                                  generation_config, **kwargs)
        if key is not None:
            self._resolved[key] = (copy.deepcopy(vars(self.generation_config)), options)
            while len(self._resolved) > 16:
                self._resolved.popitem(last=False)
        return options

    def generate(self, input_ids=None, attention_mask: torch.Tensor | None = None, generation_config=None,
                 **kwargs):
        """HF-compatible generate. input_ids: int tensor [batch, S] (+ attention_mask, right padding) or a
        list of token-id lists; kwargs: HF's generation options, plus `seed` (int) for sampling."""
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        options = self.resolve(generation_config, **kwargs)
        # a padded batch on this CUDA device is checked and packed there (three ints read back); anything
        # else, or anything the device's checks flag, on the host (which says what is wrong)
        packed = None if self._device_packer is None else self._device_packer(input_ids, attention_mask,
                                                                                options.max_length)
        if packed is None:
            packed = inputs.packed_sources(input_ids, attention_mask, self.weights, options.max_length)
        if not self.runner.holds_state(packed, options):
            # a new bucket's state allocates its buffers: checked first (a kept state's call allocates only its
            # outputs, and the query costs tens of us of host time before the call's first GPU work)
            rows = packed.batch * options.rows_per_source
            needed = inputs.estimate_bytes(self.weights, packed.batch, packed.total_tokens, packed.max_seqlen, rows,
                                           options.max_length - 1, self.ops.fragment_step_rows())
            free = inputs.free_device_bytes(self.device)
            if self.runner.states and not inputs.fits(needed, free):
                self.runner.clear()     # the kept states' buffers are the first memory to give back
                free = inputs.free_device_bytes(self.device)
            inputs.check_memory(needed, self.device, free)
        with torch.inference_mode():
            return decode(self.runner, packed, lambda p: encode(self.weights, self.ops, p), options)


def _keywords_key(kwargs: dict) -> tuple | None:
    """generate()'s keywords as a hashable key that tells 1 from True and 1.0 (None where a value is of a
    kind it does not take apart: such calls resolve every time)."""
    def freeze(value):
        if isinstance(value, (list, tuple)):
            return type(value).__name__, tuple(freeze(v) for v in value)
        if isinstance(value, dict):
            return "dict", tuple(sorted((k, freeze(v)) for k, v in value.items()))
        if value is None or isinstance(value, (bool, int, float, str)):
            return type(value).__name__, value
        raise TypeError(type(value).__name__)
    try:
        return tuple(sorted((name, freeze(value)) for name, value in kwargs.items()))
    except TypeError:
        return None


def decode(runner: Runner, packed: PackedSources, encoder, options: GenerationOptions):
    """The decode loop of one generate() call, for any decoder backend (runner.py): the bucket's state
    loaded with this call's sources (encoder: the encoder's output, or a callable(packed) returning it;
    Runner.load), the search run, and HF's return value (sequences, or HF's output class with
    return_dict_in_generate)."""
    state = runner.state(packed, options)
    runner.load(state, packed, encoder)
    state.search.reset()
    if options.do_sample:
        state.search.generator = make_generator(runner.device, options.seed)
    runner.run(state, options.max_length - 1)
    if options.num_beams > 1:
        result = state.search.result()
        sequences, scores = result.sequences, result.scores
    else:
        sequences, scores = state.search.result(), None
    return hf_output(sequences, scores, options)


def hf_output(sequences: torch.Tensor, scores: torch.Tensor | None, options: GenerationOptions):
    """What HF's generate returns for these sequences (and beam search's sequences_scores): the tensor,
    or with return_dict_in_generate HF's output class."""
    if not options.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateBeamEncoderDecoderOutput, GenerateEncoderDecoderOutput
    if options.num_beams > 1:
        return GenerateBeamEncoderDecoderOutput(sequences=sequences,
                                                sequences_scores=scores if options.output_scores else None)
    return GenerateEncoderDecoderOutput(sequences=sequences)
