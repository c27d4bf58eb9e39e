"""The log reader's blocks of lines: tracebacks (the last frame and the error line), JAX's compiles and their
cache-miss explanations, failures and the lines that record a run's facts (evals, checkpoints, chips, JSON lines).
A mixin of LogScanner (logs/scanner.py), whose state it uses."""

from __future__ import annotations

import json
from collections.abc import Callable

from tpuops.logs.events import MAX_EVENTS, Compile, Event, Failure, LogReport, add_chip_sample, chip_sample
from tpuops.logs.fields import STEP_LISTS, floats, kv, num
from tpuops.logs.lines import FRAME, MISS_FN


class Blocks:
    """What LogScanner keeps for these lines; LogScanner.__init__ sets every one."""

    r: LogReport
    worker: int
    on_event: Callable[[Event], None] | None
    _pending: list[Compile]
    _explain: dict[str, str]
    _miss: list[str] | None
    _tb: dict[str, str] | None
    _in_eval: bool

    def _fail(self, failure: Failure) -> None:
        self.r.add_failure(failure)
        if self.on_event:
            self.on_event(failure)

    def _end_blocks(self) -> None:
        if self._miss is not None:
            self._end_miss()
        if self._tb is not None:
            self._traceback_line("")

    def _compile(self, fn: str) -> None:
        name = fn[fn.index("(") + 1 : -1] if fn.endswith(")") and "(" in fn else fn
        c = self.r.compiles
        c["total"] += 1
        if self._in_eval:
            c["eval"] += 1
            return
        explanation = self._explain.pop(name, None)
        c["open"] += 1
        comp = Compile(None, name, explanation, self.r.lines, self.worker)
        if len(self._pending) < MAX_EVENTS:
            self._pending.append(comp)
        if self.on_event:
            self.on_event(comp)

    def _end_miss(self) -> None:
        lines, self._miss = self._miss or [], None
        for text in lines[1:]:
            if m := MISS_FN.match(text):
                name = m["fn"] or m["unseen"]
                if len(self._explain) > 64:
                    self._explain.pop(next(iter(self._explain)))
                self._explain[name] = "\n".join(lines)[:4000]
                return

    def _traceback_line(self, text: str) -> bool:
        """In a traceback: keep the last frame; the first unindented line is the error. True: consumed."""
        tb = self._tb or {}
        if m := FRAME.match(text):
            tb["frame"], tb["code"] = f"{m['file']}:{m['line']} in {m['fn']}", ""
            return True
        if text[:1].isspace():
            if tb["frame"] and not tb["code"] and text.strip() and set(text.strip()) - set("^~ "):
                tb["code"] = text.strip()
            return True
        self._tb = None
        detail = tb["frame"] + (f": {tb['code']}" if tb["code"] else "")
        message = text.strip() or "(traceback without an error line: the log ends inside it)"
        self._fail(Failure("traceback", message[:500], detail, self.r.lines, self.worker))
        return False

    def _record(self, kind: str, text: str) -> None:
        r = self.r
        if kind == "eval_begin":
            self._in_eval = True
        elif kind == "eval_end":
            self._in_eval = False
        elif kind == "eval":
            if len(r.evals) < MAX_EVENTS:
                r.evals.append({k: num(v) for k, v in kv(text).items()})
        elif kind == "checkpoint":
            r.checkpoints += 1
            pairs = kv(text)
            r.last_checkpoint = pairs.get("path")
            r.last_checkpoint_step = int(pairs["step"]) if pairs.get("step", "").isdigit() else None
        elif kind == "reward_errors":
            pairs = kv(text)
            name = pairs.get("name", "?")
            count = num(pairs.get("count", "1"))
            r.reward_errors[name] = r.reward_errors.get(name, 0) + (
                int(count) if isinstance(count, int) else 1
            )
        elif kind in ("start", "batch"):
            setattr(r, kind, kv(text))
        elif kind == "chips":  # another process's chips: `chips: step=N process=P hbm_gb_min=...`
            pairs = kv(text)
            values: dict[str, object] = {k: num(v) for k, v in pairs.items() if k not in STEP_LISTS}
            values.update({k: floats(pairs.get(k)) for k in STEP_LISTS})
            step, process = values.get("step"), values.get("process")
            sample = chip_sample(step if isinstance(step, int) else -1, values)
            if sample is not None:  # keyed by the process that printed it (worker k runs process k)
                add_chip_sample(
                    r.chips.setdefault(process if isinstance(process, int) else self.worker, []), sample
                )

    def _json(self, kind: str, raw: str) -> None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            return
        if kind == "metrics":
            if len(self.r.metrics) < MAX_EVENTS:
                self.r.metrics.append(data)
        else:
            setattr(self.r, kind, data)
