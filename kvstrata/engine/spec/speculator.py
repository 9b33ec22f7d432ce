"""The engine's side of speculative decoding: which decode rows get drafts, and what they taught.

After the scheduler has built a step, `Speculator.draft` offers each decode row (one token left to
compute) a draft from its `RequestDrafter` (drafter.py): the row then computes its last token and
the k drafted ones in one pass (the runner gives it k + 1 rows of logits, verify.py keeps what the
model agrees with). Drafts take room the step leaves: the step budget, free KV pages (never by
preempting), and under `auto` at most `spec_max_step_rows` rows in all: up to there a step costs its
weight reads, wider it is compute-bound and each extra row costs about what a decode step saves.
Rows with the best drafts (most expected accepted tokens) are served first. Under `auto` two kinds of
step take no drafts, because a prompt's first token waits on them: a step that computes a prompt chunk,
and the step right after one in which a request finished while others decode (an agent sends its next
request a round trip after the reply ends, so that request's prompt waits on the step then running).

Modes (`--speculative`): `ngram` drafts from the request's own prompt and output (prompt lookup);
`suffix` also from its tenant's recent outputs (the `extra_key`: a tenant's text never drafts for
another); `auto` is suffix within the row cap, and a request whose drafts keep failing stops
drafting. A constrained request's draft is cut where its grammar would refuse a token.
"""
from __future__ import annotations

from typing import Sequence

from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.request import Request
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.engine.spec.cost import FALLBACK, StepCost
from kvstrata.engine.spec.drafter import RequestDrafter, SpecConfig, SpecStats, TenantOutputs

MODES = ("auto", "off", "suffix", "ngram")


class Speculator:
    def __init__(self, mode: str, max_tokens: int, max_step_rows: int, max_model_len: int,
                 end_ids: Sequence[int] = ()) -> None:
        """`end_ids`: the tokens that end a reply (the model's EOS): no draft goes past one."""
        if mode not in MODES or mode == "off":
            raise ValueError(f"speculative mode must be one of {MODES[:1] + MODES[2:]}, got {mode!r}")
        self.mode = mode
        # explicit modes draft whatever the acceptance; auto gives up on a request that keeps failing
        self.config = SpecConfig(max_tokens=max_tokens, end_ids=frozenset(end_ids),
                                 **({} if mode == "auto" else {"disable_below": 0.0}))
        self.max_step_rows = max_step_rows if mode == "auto" else None
        self.max_model_len = max_model_len
        self.outputs = TenantOutputs(self.config)
        self._drafters: dict[str, RequestDrafter] = {}
        self.totals = SpecStats()  # over every request, for /metrics
        self.cost: StepCost = FALLBACK  # what a step's rows cost here (cost.py)
        self.measured = False  # cost timed on the host (Engine.measure_spec_cost)
        self.follow_up_due = False  # a request finished in the last step: its client's next request is on its way

    def _drafter(self, req: Request) -> RequestDrafter:
        d = self._drafters.get(req.request_id)
        if d is None:  # made at the request's first decode step
            tenant = req.params.extra_key or ""
            d = RequestDrafter(req.token_ids, tenant, self.outputs, self.config, output_start=req.num_prompt_tokens)
            self._drafters[req.request_id] = d
            req.stats.spec = d.stats  # the stats line and /metrics read the drafter's own counts
        return d

    def draft(self, batch: ScheduledBatch, kv: KVCacheManager, budget: int) -> None:
        """Add drafts to the batch's decode rows, within `budget` more tokens; allocates their KV slots.

        Under `auto`, drafted tokens join the step while they pay: a token accepted with probability p
        (the draft's own estimate times the request's record at its site, site_stats.py) adds p tokens
        to the step and a row over its context to its time (`StepCost`, timed on the host), so it
        joins while p / its row's time > the step's expected tokens / its time, best first, within
        `spec_max_step_rows` rows. A long context makes a row dearer: it is scored once a row."""
        rows = sum(batch.num_tokens)
        room = budget if self.max_step_rows is None else min(budget, self.max_step_rows - rows)
        follow_up, self.follow_up_due = self.follow_up_due, False
        if room <= 0 or (self.max_step_rows is not None and (follow_up or self.computes_a_prompt(batch))):
            return
        cost = self.cost
        offers: list[tuple[float, float, int, int]] = []  # (gain / time, gain, request index, position in its draft)
        drafts: dict[int, list[int]] = {}
        step_time, expected = cost.base, 0.0
        for i, req in enumerate(batch.requests):
            n = batch.num_tokens[i]
            context = req.num_computed_tokens + n
            step_time += cost.request(context, n)
            expected += batch.samples(i)
            if n != 1 or not batch.samples(i):
                continue
            # emitted tokens: accepted drafts + 1, within max_tokens and the context
            left = min(req.params.max_tokens - req.num_output_tokens, self.max_model_len - req.num_tokens) - 1
            drafter = self._drafter(req)
            d = drafter.propose(min(room, left))
            tokens = d.tokens
            if tokens and req.matcher is not None:
                tokens = tokens[: req.matcher.validate_tokens(tokens)]
            if tokens:
                drafts[i] = tokens
                chances = drafter.accept_chances(tokens)
                for j, p in enumerate(d.probs[: len(tokens)]):
                    gain = p * chances[j]
                    offers.append((gain / cost.extra_row(req.num_tokens + j + 1), gain, i, j))
        take: dict[int, int] = {}
        for rate, gain, i, j in sorted(offers, key=lambda o: -o[0]):
            if room <= 0 or (self.max_step_rows is not None and rate <= expected / step_time):
                break
            if j != take.get(i, 0):  # a request's drafted tokens join in order
                continue
            take[i] = j + 1
            expected, step_time, room = expected + gain, step_time + gain / rate, room - 1
        for i, k in take.items():
            req = batch.requests[i]
            if not kv.can_allocate(req, 1 + k):
                continue
            kv.allocate(req, 1 + k)
            batch.drafts[i] = drafts[i][:k]
            batch.num_tokens[i] += k

    @staticmethod
    def computes_a_prompt(batch: ScheduledBatch) -> bool:
        """Whether a request of the batch computes prompt tokens this step (a chunk, or a preempted request's
        recompute). `auto` adds no drafts to such a step: the step is long (a chunk of rows over its
        context), so a drafted row looks cheap beside it, but every row it adds is time that request's first
        token waits (docs/speculative.md: "No drafts beside a prompt chunk")."""
        return any(n != 1 or not batch.samples(i) for i, n in enumerate(batch.num_tokens))

    def emitted(self, req: Request, tokens: list[int], drafted: int, accepted: int) -> None:
        """The request's step emitted `tokens`; `accepted` of its `drafted` tokens were the model's."""
        d = self._drafters.get(req.request_id)
        if d is None:
            return
        d.append(tokens)
        if drafted:
            d.record(drafted, accepted)
            self.totals.add_step(drafted, accepted)

    def finish(self, req: Request, keep_output: bool) -> None:
        """The request ended; its output joins its tenant's recent outputs unless `keep_output` is False
        (an abort or an error) or the mode drafts from the request alone."""
        d = self._drafters.pop(req.request_id, None)
        if d is not None and keep_output and self.mode != "ngram":
            d.finish()
        # the step after a finished reply stays short: its client's next request arrives during that step
        # (docs/speculative.md: "The step after a reply ends")
        self.follow_up_due = self.follow_up_due or (keep_output and d is not None)

    @property
    def num_requests(self) -> int:
        return len(self._drafters)

