"""Generate text from one checkpoint of a training job, with the job's own model, tokenizer and
checkpointer, through torchtune 0.6.1's ``torchtune.generation.generate``.

Run it by path, with the training job's config and overrides, plus keys of its own::

    python recipes/generate_text.py --config <job config> <job overrides...> \\
        generate.checkpoint_dir=/abs/out/epoch_3 generate.output_dir=/abs/job/generate \\
        "generate.prompt=What is the capital of Xyzzy?"

Its own keys are ``generate.<key>=<value>`` (``+generate.<key>=`` is the same). They are taken
out of the arguments *before* torchtune's parser reads the rest, so a value is used verbatim:
a prompt may hold ``=``, ``:``, ``${...}``, brackets or quotes, which OmegaConf's override
grammar would otherwise read as YAML or interpolations. Everything else is the job's config and
overrides, parsed exactly as the training recipes parse them (``torchtune.config.parse``).

Keys (default):
    checkpoint_dir   (required) an ``epoch_N/`` folder of the job, or ``base``: the job's input
                     checkpoint as its config names it (the untrained model; LoRA switched off)
    output_dir       (a temporary folder, removed at the end) the checkpointer's ``output_dir``:
                     torchtune's checkpointers create it; nothing else is written there. Never
                     the training job's ``output_dir``, never inside the checkpoint
    prompt           the user message (one-shot mode)
    prompt_file      a UTF-8 file holding the prompt (instead of ``prompt``)
    system           (``dataset.new_system_prompt`` of the config, if any) a system message
    max_new_tokens   (64) at most this many new tokens
    temperature      (0.0) 0 is greedy: the most likely token every step, exactly
    top_k            (none) sample among the k most likely tokens only
    seed             (0) seeds the sampling; the same request gives the same text
    enable_kv_cache  (true) as torchtune's generate recipe; false recomputes the whole sequence
    stream           (false) one-shot mode: write the text as it is generated
    serve            (false) serve mode, below
    idle_timeout_s   (600) serve mode: end after this many seconds without a request

The prompt is formatted as torchtune's generate recipe does (``recipes/generate.py``): an optional
system message, the user message, an empty assistant message, through the tokenizer's own
``prompt_template`` with ``inference=True`` (BOS, no EOS). ``instruct_dataset`` builds a
training sample the same way (user message = the input column, assistant message = the output
column, through the same tokenizer and template), so the model sees at generation exactly the
prefix it saw in training, and its answer continues as the assistant's message did.

Checkpoint kinds (:mod:`tune_magic.checkpoints.catalog` tells them apart from the files):
    full         the model shards of ``epoch_N/`` loaded into ``cfg.model``;
    lora_merged  the merged shards of ``epoch_N/`` loaded into the LoRA builder ``cfg.model``
                 with every adapter switched off (``disabled``), so each layer computes exactly
                 ``W x`` with the merged ``W``;
    adapter_only the base from the config's ``checkpointer.checkpoint_dir`` / ``checkpoint_files``
                 plus ``epoch_N/adapter_model.pt`` (torchtune's names), adapters on, as in training.

Modes and output:
    one-shot     ``generate.prompt`` (or ``prompt_file``): stdout receives ONLY the generated text,
                 then one newline (strip exactly one); logs go to stderr. Exit 0.
    serve        ``generate.serve=true``: the model is loaded once; each stdin line is one JSON
                 request ``{"prompt": ..., "system", "max_new_tokens", "temperature", "top_k",
                 "seed", "stream", "id"}`` (all but ``prompt`` optional; defaults are the keys
                 above). Each gets one JSON line on stdout, flushed: ``{"text", "tokens",
                 "prompt_tokens", "seconds", "stop", "request", "loads", "load_seconds"}`` (``id``
                 echoed when given; ``stop`` is ``"eos"`` or ``"length"``; ``seconds`` is this
                 request's generation time; ``loads`` stays 1: the model is loaded once), or
                 ``{"error": "...", "request": n}`` for a bad request, e.g. a prompt longer than
                 ``tokenizer.max_seq_len``; then the next request. With ``"stream": true``
                 ``{"partial": "<new text>", "request": n}`` lines come first. It ends, exit 0,
                 on end of stdin, after ``idle_timeout_s`` without a request, or on SIGTERM (a
                 request being generated is abandoned); the reason is logged on stderr.

Errors that stop it (bad keys, a missing, incomplete or mismatched checkpoint, and in one-shot
mode a prompt too long) print ``generate_text: error: <what and how to fix it>`` as the last
stderr line and exit 2.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, TextIO

PREFIX = "generate."
REQUEST_KEYS = ("prompt", "system", "max_new_tokens", "temperature", "top_k", "seed", "stream", "id")


class UsageError(Exception):
    """A mistake in the call or the request; the message says what to change."""


@dataclass(frozen=True)
class Options:
    """The ``generate.*`` keys (module docstring)."""

    checkpoint_dir: str | None = None
    output_dir: str | None = None
    prompt: str | None = None
    prompt_file: str | None = None
    system: str | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    enable_kv_cache: bool = True
    stream: bool = False
    serve: bool = False
    idle_timeout_s: float = 600.0


_TYPES = {f.name: f.type for f in fields(Options)}


def _value(key: str, raw: Any) -> Any:
    """``raw`` (a CLI string, or a JSON value) as ``key``'s type; ``UsageError`` when it is not one."""
    kind = _TYPES[key]  # the annotation's text: "int", "float", "bool", "str | None", "int | None"
    base = kind.split(" | ")[0]
    if base != "str" and (raw is None or (isinstance(raw, str) and raw.lower() in ("null", "none"))):
        if "None" in kind:
            return None
        raise UsageError(f"{key} needs a {base} value, not {raw!r}")
    try:
        if isinstance(raw, bool) and base != "bool":
            raise ValueError
        if base == "int":
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        if base == "float":
            return float(raw)
        if base == "bool":
            return raw if isinstance(raw, bool) else {"true": True, "false": False}[str(raw).lower()]
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{key}={raw!r} is not a valid {base}") from None
    if not isinstance(raw, str):
        raise UsageError(f"{key} must be a string, not {type(raw).__name__}")
    return raw


def check_options(opts: Options) -> Options:
    """``opts`` if its numbers are in range, else ``UsageError`` naming the key."""
    if opts.max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be >= 1, not {opts.max_new_tokens}")
    if opts.temperature < 0:
        raise UsageError(f"temperature must be >= 0 (0 is greedy), not {opts.temperature}")
    if opts.top_k is not None and opts.top_k < 1:
        raise UsageError(f"top_k must be >= 1 or null, not {opts.top_k}")
    if opts.idle_timeout_s <= 0:
        raise UsageError(f"idle_timeout_s must be > 0 seconds, not {opts.idle_timeout_s}")
    return opts


def split_argv(argv: list[str]) -> tuple[Options, list[str]]:
    """Take the ``generate.*`` words out of ``argv``; return (the options, the other words).

    Raises:
        UsageError: an unknown key, a bad value, no checkpoint, or no prompt outside serve mode.
    """
    found: dict[str, Any] = {}
    rest = []
    for word in argv:
        bare = word[1:] if word.startswith("+" + PREFIX) else word
        if not bare.startswith(PREFIX):
            rest.append(word)
            continue
        key, eq, raw = bare[len(PREFIX):].partition("=")
        if key not in _TYPES or not eq:
            known = ", ".join(PREFIX + k for k in _TYPES)
            raise UsageError(f"{word!r} is not a generate key=value (known keys: {known})")
        found[key] = _value(key, raw)
    opts = check_options(Options(**found))
    if not opts.checkpoint_dir:
        raise UsageError("say which checkpoint: generate.checkpoint_dir=<output_dir>/epoch_N, or "
                         "generate.checkpoint_dir=base for the job's input model")
    if opts.prompt is not None and opts.prompt_file is not None:
        raise UsageError("give generate.prompt or generate.prompt_file, not both")
    if opts.prompt_file is not None:
        try:
            opts = replace(opts, prompt=Path(opts.prompt_file).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read generate.prompt_file {opts.prompt_file}: {exc.strerror}") from None
    if opts.prompt is None and not opts.serve:
        raise UsageError("give generate.prompt=<text> (or generate.prompt_file=<path>), or generate.serve=true")
    return opts, rest


def request_from_json(line: str, defaults: Options) -> tuple[Options, Any]:
    """A serve-mode request line as (options for this request, its ``id``).

    Raises:
        UsageError: not a JSON object, no prompt, an unknown key or a bad value.
    """
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"not JSON ({exc}); send one JSON object per line") from None
    if not isinstance(obj, dict):
        raise UsageError("send one JSON object per line, e.g. {\"prompt\": \"...\"}")
    unknown = sorted(set(obj) - set(REQUEST_KEYS))
    if unknown:
        raise UsageError(f"unknown request key(s) {unknown}; known: {list(REQUEST_KEYS)}")
    if not isinstance(obj.get("prompt"), str):
        raise UsageError("a request needs \"prompt\": a string")
    values = {k: _value(k, v) for k, v in obj.items() if k != "id"}
    return check_options(replace(defaults, **values)), obj.get("id")


# -- the model ---------------------------------------------------------------------------------------


class Generator:
    """The job's model, tokenizer and checkpoint, loaded once; :meth:`generate` answers requests.

    Args:
        cfg: the job's config (``model``, ``tokenizer``, ``checkpointer``, ``device``, ``dtype``).
        opts: the ``generate.*`` options (checkpoint, output_dir, defaults).

    Raises:
        UsageError: the checkpoint is missing, incomplete, of a kind the model cannot take, or
            output_dir is the job's.
    """

    def __init__(self, cfg, opts: Options) -> None:
        from torchtune import config, training, utils

        start = time.perf_counter()
        self.log = utils.get_logger("INFO")
        self.device = utils.get_device(device=cfg.get("device", None))
        self.dtype = training.get_dtype(cfg.get("dtype", None), device=self.device)
        self.checkpoint = _checkpoint(opts.checkpoint_dir, cfg)
        self.tokenizer = config.instantiate(cfg.tokenizer)
        self.model = _load_model(cfg, opts, self.checkpoint, self.device, self.dtype, self.log)
        self.kv_cache = opts.enable_kv_cache
        self.loads = 1
        self.load_seconds = time.perf_counter() - start
        kind = self.checkpoint.kind if self.checkpoint else "base"
        self.log.info(f"Loaded {opts.checkpoint_dir} ({kind}) in {self.load_seconds:.2f} s")

    def prompt_tokens(self, prompt: str, system: str | None) -> list[int]:
        """The prompt as torchtune's generate recipe tokenizes it (module docstring), untruncated.

        Raises:
            UsageError: longer than the tokenizer's ``max_seq_len``.
        """
        from torchtune.data import Message

        messages = [Message(role="system", content=system)] if system else []
        messages += [Message(role="user", content=prompt), Message(role="assistant", content="")]
        limit = getattr(self.tokenizer, "max_seq_len", None)
        self.tokenizer.max_seq_len = None  # measure the whole prompt; the tokenizer would cut it silently
        try:
            tokens = self.tokenizer({"messages": messages}, inference=True)["tokens"]
        finally:
            self.tokenizer.max_seq_len = limit
        if limit is not None and len(tokens) > limit:
            raise UsageError(f"the prompt is {len(tokens)} tokens, longer than the tokenizer's max_seq_len "
                             f"({limit}) the job uses: shorten the prompt, or raise tokenizer.max_seq_len "
                             f"(an override; the model takes at most {self._model_max()} tokens in all)")
        return tokens

    def _model_max(self) -> int:
        return int(getattr(self.model, "max_seq_len", 0) or 0) or 1 << 30

    def _setup_caches(self, length: int) -> None:
        """Size the KV cache for this request exactly, as torchtune's generate recipe does."""
        from torchtune.modules.common_utils import delete_kv_caches

        if self.model.caches_are_setup():
            delete_kv_caches(self.model)
        with self.device:
            self.model.setup_caches(batch_size=1, dtype=self.dtype, decoder_max_seq_len=length)

    def generate(self, opts: Options, on_text: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Generate for one request.

        Returns:
            ``{"text", "tokens", "prompt_tokens", "seconds", "stop"}``.

        Raises:
            UsageError: the prompt is too long, or prompt + ``max_new_tokens`` exceed the model's
                ``max_seq_len``.
        """
        import torch
        from torchtune import generation

        tokens = self.prompt_tokens(opts.prompt, opts.system)
        room = self._model_max() - len(tokens)
        if opts.max_new_tokens > room:
            raise UsageError(f"the prompt ({len(tokens)} tokens) and max_new_tokens={opts.max_new_tokens} exceed the "
                             f"model's max_seq_len ({self._model_max()}): ask for at most {max(room, 0)} new tokens")
        start = time.perf_counter()
        with torch.inference_mode():
            if self.kv_cache:
                self._setup_caches(len(tokens) + opts.max_new_tokens)
            rng = torch.Generator(device=self.device)
            rng.manual_seed(opts.seed)
            # torchtune samples argmax(probs / q) with random q: top_k=1 leaves one finite logit, so
            # temperature 0 is exactly greedy (and never divides logits by ~0, which overflows fp16).
            temperature, top_k = (1.0, 1) if opts.temperature == 0 else (opts.temperature, opts.top_k)
            streamer = _Streamer(self.tokenizer, on_text) if on_text else None
            out, _ = generation.generate(
                model=self.model, prompt=torch.tensor(tokens, dtype=torch.int, device=self.device),
                max_generated_tokens=opts.max_new_tokens, pad_id=self.tokenizer.pad_id, temperature=temperature,
                top_k=top_k, stop_tokens=self.tokenizer.stop_tokens, rng=rng, custom_generate_next_token=streamer)
        new = out[0, len(tokens):].tolist()
        stops = set(self.tokenizer.stop_tokens or ())
        end = next((i for i, t in enumerate(new) if t in stops), None)
        ids = new if end is None else new[:end]
        text = self.tokenizer.decode(ids)
        if streamer is not None:
            streamer.finish(text)
        return {"text": text, "tokens": len(ids), "prompt_tokens": len(tokens),
                "seconds": round(time.perf_counter() - start, 6), "stop": "length" if end is None else "eos"}


class _Streamer:
    """torchtune's ``generate_next_token``, reporting the text so far as tokens arrive.

    ``generation.generate`` calls it for every token after the first with ``x`` = the token just
    chosen (the whole sequence without a KV cache), so the text lags one token; :meth:`finish`
    sends what is left.
    """

    def __init__(self, tokenizer, on_text: Callable[[str], None]) -> None:
        self.tokenizer, self.on_text = tokenizer, on_text
        self.ids: list[int] = []
        self.sent = ""

    def __call__(self, model, input_pos, x, q=None, *, mask=None, temperature=1.0, top_k=None):
        from torchtune import generation

        token = int(x[0, -1])
        if token not in (self.tokenizer.stop_tokens or ()):
            self.ids.append(token)
            self._send(self.tokenizer.decode(self.ids))
        return generation.generate_next_token(model, input_pos=input_pos, x=x, q=q, mask=mask,
                                              temperature=temperature, top_k=top_k)

    def _send(self, text: str) -> None:
        # Hold back a byte-fallback character still incomplete (decoded as U+FFFD) and any text
        # that rewrites what was sent (SentencePiece decodes a prefix's leading space differently).
        if text.endswith("\ufffd") or not text.startswith(self.sent) or text == self.sent:
            return
        self.on_text(text[len(self.sent):])
        self.sent = text

    def finish(self, text: str) -> None:
        self._send(text)


def _checkpoint(name: str, cfg):
    """The catalog's view of ``generate.checkpoint_dir`` (``None`` for ``base``), checked against the
    job's settings.

    Raises:
        UsageError: not a complete ``epoch_N/`` folder, or of a kind this model cannot take.
    """
    from omegaconf import OmegaConf

    from tune_magic.checkpoints.catalog import SaveSettings

    settings = SaveSettings.from_config(OmegaConf.to_container(cfg, resolve=True))
    ckpt = _checkpoint_folder(name, settings)
    if ckpt is not None and ckpt.kind == "adapter_only" and settings.lora is False:
        raise UsageError(f"{ckpt.path} holds a LoRA adapter only, and the config's model "
                         f"({cfg.model._component_}) is not a LoRA builder: pass the config the job trained with")
    return ckpt


def _checkpoint_folder(name: str, settings=None):
    """``name``'s folder as the catalog reads it, with the job's settings when given (``None`` for
    ``base``). Without them a merged LoRA save that has written its shards but not yet its adapter
    passes as a full checkpoint; with them it is incomplete.

    Raises:
        UsageError: not an ``epoch_N/`` folder, gone (pruned), or still being written.
    """
    from tune_magic.checkpoints.catalog import CheckpointError, read_checkpoint

    if name == "base":
        return None
    try:
        ckpt = read_checkpoint(Path(name))
        if settings is not None:
            if ckpt.kind == "adapter_only" and settings.lora:
                # The shards come first in a save: an adapter alone is a whole adapter-only save,
                # whatever save_adapter_weights_only the words given here say.
                settings = replace(settings, adapter_weights_only=True)
            ckpt = read_checkpoint(Path(name), settings)
    except CheckpointError as exc:
        raise UsageError(f"{exc}; pass generate.checkpoint_dir=<the job's output_dir>/epoch_N") from None
    if not ckpt.complete:
        raise UsageError(f"{ckpt.path} is not a complete checkpoint ({'; '.join(ckpt.problems)}): wait for the "
                         "save to end, or use an earlier epoch")
    return ckpt


def _checkpointer_config(cfg, opts: Options, ckpt):
    """The job's checkpointer section, pointed at the checkpoint to read and at our output_dir."""
    from omegaconf import OmegaConf

    out = Path(opts.output_dir).absolute()
    if ckpt is not None and (out == ckpt.path or ckpt.path in out.parents):
        raise UsageError(f"generate.output_dir ({out}) is inside the checkpoint {ckpt.path}; give a folder outside it")
    section = OmegaConf.to_container(cfg.checkpointer, resolve=True)
    section.update(output_dir=opts.output_dir, adapter_checkpoint=None, recipe_checkpoint=None)
    section.pop("resume_from_checkpoint", None)
    if ckpt is not None and ckpt.kind != "adapter_only":
        section.update(checkpoint_dir=str(ckpt.path), checkpoint_files=list(ckpt.model_files))
    return OmegaConf.create(section)


def _load_model(cfg, opts: Options, ckpt, device, dtype, log):
    """Build ``cfg.model`` and load the checkpoint into it (the three kinds: module docstring).

    Raises:
        UsageError: the weights do not fit the model (missing or unexpected keys).
    """
    import torch
    from torchtune import config, training

    with training.set_default_dtype(dtype), device:
        model = config.instantiate(cfg.model)
    adapters = [m for m in model.modules() if hasattr(m, "adapter_params") and hasattr(m, "disabled")]
    checkpointer = config.instantiate(_checkpointer_config(cfg, opts, ckpt), should_load_recipe_state=False)
    state = checkpointer.load_checkpoint()[training.MODEL_KEY]
    missing, unexpected = model.load_state_dict(state, strict=False)
    del state
    if ckpt is not None and ckpt.kind == "adapter_only":
        adapter = torch.load(ckpt.path / "adapter_model.pt", map_location="cpu", weights_only=True)
        more = model.load_state_dict(adapter, strict=False)
        missing = [k for k in missing if k not in adapter]
        unexpected = list(unexpected) + list(more.unexpected_keys)
    else:
        for m in adapters:  # merged (or base) weights: W x exactly, the adapter's B A x left out
            m.disabled = True
        missing = [k for k in missing if "lora_" not in k and "magnitude" not in k] if adapters else missing
    if missing or unexpected:
        raise UsageError(f"the checkpoint does not fit the config's model: missing {sorted(missing)[:5]}, unexpected "
                         f"{sorted(unexpected)[:5]}; pass the config (and overrides) the job trained with")
    model.eval()
    log.info(f"Model {cfg.model._component_} on {device} in {dtype}; {len(adapters)} adapter layers "
             f"{'on' if ckpt is not None and ckpt.kind == 'adapter_only' else 'off'}")
    return model


# -- the two modes -----------------------------------------------------------------------------------


class _Terminated(Exception):
    """SIGTERM arrived (serve mode)."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _write(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _answer(gen: Generator, line: str, defaults: Options, n: int, out: TextIO) -> dict[str, Any]:
    """One serve-mode request's answer (an ``error`` answer for a bad request)."""
    head: dict[str, Any] = {"request": n}
    try:
        opts, rid = request_from_json(line, defaults)
        if rid is not None:
            head["id"] = rid
        on_text = (lambda t: _write(out, {"partial": t, **head})) if opts.stream else None
        result = gen.generate(opts, on_text)
    except UsageError as exc:
        return {"error": str(exc), **head}
    return {**result, **head, "loads": gen.loads, "load_seconds": round(gen.load_seconds, 6)}


def _read_lines(fd: int, lines: queue.Queue) -> None:
    """Put each line of ``fd`` on ``lines`` (bytes), then ``None`` at its end.

    Reads the file descriptor itself, not ``sys.stdin``: a daemon thread blocked inside the
    buffered ``sys.stdin`` holds its lock, and interpreter shutdown (after an idle timeout or
    SIGTERM) then aborts the process (``could not acquire lock for <stdin> at interpreter shutdown``).
    """
    pending, chunk = b"", b"start"
    while chunk:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            chunk = b""
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            lines.put(line)
    if pending:
        lines.put(pending)
    lines.put(None)


def serve(gen: Generator, defaults: Options, out: TextIO, stdin_fd: int = 0) -> int:
    """Answer JSON requests from ``stdin_fd`` until it ends, ``idle_timeout_s`` pass, or SIGTERM."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(stdin_fd, lines), name="generate-stdin", daemon=True).start()
    signal.signal(signal.SIGTERM, _on_sigterm)
    n = 0
    try:
        while True:
            try:
                raw = lines.get(timeout=defaults.idle_timeout_s)
            except queue.Empty:
                gen.log.info(f"Serve: no request for {defaults.idle_timeout_s:g} s, ending")
                return 0
            if raw is None:
                gen.log.info("Serve: end of input, ending")
                return 0
            if raw.strip():
                n += 1
                _write(out, _answer(gen, raw.decode("utf-8", errors="replace"), defaults, n, out))
    except _Terminated:
        gen.log.info("Serve: SIGTERM, ending")
        return 0


def claim_stdout() -> TextIO:
    """Keep the real stdout for the answers; send everything else written there to stderr.

    torch, torchao and torchtune print warnings and logs at import and load; some write to fd 1
    from C. The answer must be the only thing on stdout.
    """
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace")


def _run(cfg, opts: Options, out: TextIO) -> int:
    """Load the model (once) and answer in the chosen mode."""
    from omegaconf import OmegaConf
    from torchtune import config, training

    training.set_seed(seed=opts.seed)
    job_out = cfg.get("output_dir", None)
    if job_out and Path(opts.output_dir).absolute() == Path(str(job_out)).absolute():
        raise UsageError(f"generate.output_dir is the training job's output_dir ({job_out}); give a folder of "
                         "its own, e.g. <job dir>/generate")
    dataset = cfg.get("dataset", None)
    if opts.system is None and OmegaConf.is_dict(dataset):  # trained with a system message: ask with it too
        opts = replace(opts, system=dataset.get("new_system_prompt", None))
    config.log_config(recipe_name="GenerateText", cfg=cfg)
    gen = Generator(cfg, opts)
    if opts.serve:
        return serve(gen, opts, out)
    on_text = (lambda t: (out.write(t), out.flush())) if opts.stream else None
    result = gen.generate(opts, on_text)
    out.write(("" if opts.stream else result["text"]) + "\n")
    out.flush()
    gen.log.info(f"Generated {result['tokens']} tokens in {result['seconds']:.2f} s (stop: {result['stop']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the words (module docstring), run, and return the exit status (0, or 2 on a usage error)."""
    out = claim_stdout()
    argv = sys.argv[1:] if argv is None else argv
    temp = None
    try:
        opts, rest = split_argv(argv)
        _checkpoint_folder(opts.checkpoint_dir)  # a wrong folder fails now, not after torch's import
        if opts.output_dir is None:
            temp = tempfile.mkdtemp(prefix="tune_magic-generate-")
            opts = replace(opts, output_dir=temp)
        from torchtune import config

        status: list[int] = []

        @config.parse
        def parsed(cfg) -> int:
            status.append(_run(cfg, opts, out))
            return status[-1]

        sys.argv = [sys.argv[0], *rest]
        try:
            parsed()
        except SystemExit:  # config.parse ends with sys.exit(recipe's result)
            if not status:
                raise
        return status[-1]
    except UsageError as exc:
        print(f"generate_text: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
