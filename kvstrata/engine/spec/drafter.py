"""A request's drafts: from its own prompt and output, and from its tenant's recent outputs.

`RequestDrafter` searches the request's tokens (`ContextMatcher`) (what the agent already wrote: the
file it sends back, the JSON it edits, the tool-call skeleton of the last turn) and the index of its
tenant's finished outputs (`TenantOutputs`: the same reply shape across requests), and keeps the more
confident draft, except where the request's own draft comes from its reply so far (a reply repeating
itself: the items of a list it writes out), which other replies of the same shape would fill with their
own values (docs/speculative.md, "Against SuffixDecoding's reference"). A draft from where the last one
came from, moved on past the model's edits (`CopyPointer`), replaces it when that place agrees better
with the context. A tenant's outputs draft only for that tenant's requests: drafts never carry one
tenant's text into another's request. A draft ends at a token that ends the reply (`end_ids`, the
model's EOS): what follows one in the context is another turn (`<|im_end|>`, then `assistant`), never
this reply. What each step emitted, against what was proposed, teaches the request's `SiteStats` where
drafts break: the chances the cost model weighs drafted tokens by.

Draft length adapts as in SuffixDecoding: at most `spec_factor` x the matched length (a long match is
a confident one), never over `max_tokens`. A request whose drafts keep failing pauses (`auto` mode):
verifying drafts that fail costs a wider step. Each run of `probation` drafted tokens is a window; one
with under `disable_below` of them accepted pauses drafting for `pause_tokens` tokens of output, twice as
long after each such window in a row (up to `max_pause`), and a window that passes resets the pause. A
pause, not an end: a reply's opening (a code block's fence and first lines, the agent's own words) may
defeat drafts that its body, a copy of the file sent, then accepts (docs/speculative.md).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from kvstrata.engine.spec.context_match import ContextMatcher
from kvstrata.engine.spec.copy_pointer import CopyPointer, aligned
from kvstrata.engine.spec.site_stats import SiteStats
from kvstrata.engine.spec.token_index import EMPTY, Draft, TokenIndex


@dataclass(frozen=True)
class SpecConfig:
    max_tokens: int = 16  # --num-speculative-tokens
    spec_factor: float = 1.0
    min_prob: float = 0.1
    min_match: int = 2
    max_match: int = 16
    disable_below: float = 0.2
    probation: int = 32  # drafted tokens a window
    pause_tokens: int = 64  # output tokens a failing window pauses drafting for (doubled while they keep failing)
    max_pause: int = 1024
    tenant_tokens: int = 1 << 16  # each tenant's recent outputs, in tokens
    max_tenants: int = 256
    end_ids: frozenset[int] = frozenset()  # tokens that end a reply: a draft stops after one

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= 64:
            raise ValueError(f"max_tokens must be 1-64, got {self.max_tokens}")
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match}, {self.max_match}")
        if self.spec_factor <= 0 or not 0 < self.min_prob <= 1 or not 0 <= self.disable_below <= 1:
            raise ValueError("spec_factor > 0, 0 < min_prob <= 1 and 0 <= disable_below <= 1 are required")
        if not 1 <= self.pause_tokens <= self.max_pause or self.probation < 1:
            raise ValueError("need 1 <= pause_tokens <= max_pause and probation >= 1")


class TenantOutputs:
    """Each tenant's recent finished outputs, one index per tenant; oldest outputs and least recently
    used tenants go first."""

    def __init__(self, config: SpecConfig) -> None:
        self.config = config
        self._tenants: OrderedDict[str, TokenIndex] = OrderedDict()
        self._next = 0

    def index(self, tenant: str) -> TokenIndex | None:
        index = self._tenants.get(tenant)
        if index is not None:
            self._tenants.move_to_end(tenant)
        return index

    def add(self, tenant: str, output: Sequence[int]) -> None:
        if not output:
            return
        c = self.config
        if tenant not in self._tenants:
            self._tenants[tenant] = TokenIndex(c.max_match)
            while len(self._tenants) > c.max_tenants:
                self._tenants.popitem(last=False)
        self._tenants.move_to_end(tenant)
        index = self._tenants[tenant]
        index.extend(self._next, output[-c.tenant_tokens:])
        self._next += 1
        while index.num_tokens > c.tenant_tokens and (oldest := index.oldest()) is not None:
            index.drop(oldest)


@dataclass
class SpecStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    accepted_lengths: dict[int, int] = field(default_factory=dict)  # accepted tokens per verify step -> steps

    rejections: int = 0  # verify steps that stopped at a drafted token the model did not choose

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def add_step(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        self.rejections += accepted < drafted
        self.accepted_lengths[accepted] = self.accepted_lengths.get(accepted, 0) + 1


class RequestDrafter:
    def __init__(self, prompt: Sequence[int], tenant: str, outputs: TenantOutputs, config: SpecConfig,
                 output_start: int | None = None) -> None:
        """`prompt`: the request's tokens so far; its output starts at `output_start` (default: after them)."""
        self.config = config
        self.tenant = tenant
        self.outputs = outputs
        self.own = ContextMatcher(prompt, config.max_match)  # searched in place: nothing to build up front
        self.output_start = len(prompt) if output_start is None else output_start
        self.stats = SpecStats()
        self.sites = SiteStats()
        self.pointer: CopyPointer | None = None
        self._proposal: tuple[int, Draft] | None = None  # (context length, draft) of the last propose
        self.paused_until = 0  # no drafts while the context is shorter (a failing window's pause)
        self._pause = config.pause_tokens  # the next failing window's pause
        self._window = (0, 0)  # (drafted, accepted) since the last window closed

    @property
    def paused(self) -> bool:
        return len(self.context) < self.paused_until

    @property
    def context(self) -> list[int]:
        """The request's tokens: prompt, then output."""
        return self.own.tokens

    def append(self, tokens: Sequence[int]) -> None:
        """Tokens the request now holds (accepted drafts and sampled tokens): what the last proposal, if
        made for this context, is scored against, and what moves the copy pointer on."""
        proposal, self._proposal = self._proposal, None
        if proposal is not None and proposal[0] == len(self.context):
            draft = proposal[1]
            self.sites.learn(self.context, draft.tokens, tokens)
            if draft.source is not None:
                self.pointer = CopyPointer(*draft.source)
        elif proposal is not None:
            self.pointer = None  # the proposal was for another context: where it came from says nothing
        p = self.pointer
        if p is not None and self.config.end_ids.intersection(p.source[p.pos:p.pos + len(tokens)]):
            self.pointer = None  # the copy ran past the end of a turn: the reply left the text it quoted
        elif p is not None:
            p.advance(len(tokens))
        self.own.extend(tokens)

    def accept_chances(self, draft: Sequence[int]) -> list[float]:
        """The chance each drafted token, and every one before it, is kept (`SiteStats`)."""
        return self.sites.chances(self.context, draft)

    def propose(self, max_tokens: int | None = None) -> Draft:
        """Up to `max_tokens` (the config's cap by default) tokens to verify after the context."""
        c = self.config
        cap = min(c.max_tokens, c.max_tokens if max_tokens is None else max_tokens)
        if self.paused or cap < 1:
            return EMPTY
        best = self.own.propose(cap, c.min_prob, c.min_match)
        # the reply repeating itself: its own tokens know the values better than other replies of the shape
        repeats = best.source is not None and best.source[1] >= self.output_start
        tenant_index = None if repeats else self.outputs.index(self.tenant)
        if tenant_index is not None:
            other = tenant_index.propose(self.context, cap, c.min_prob, c.min_match)
            if other.score > best.score:
                best = other
        keep = min(cap, max(1, math.ceil(c.spec_factor * best.match_len)))
        draft = Draft(best.tokens[:keep], best.probs[:keep], best.match_len, best.source)
        if self.pointer is not None:
            score, pos = self.pointer.best(self.context)
            source = self.pointer.source
            if score > (aligned(*best.source, self.context) if best.source is not None else 0):
                tokens = [int(t) for t in source[pos:pos + cap]]  # a tenant's output is an int32 array
                # a place whose next token ends a turn: the copy reached the end of another turn's text (a
                # user message the reply quoted), which says nothing of where the reply goes
                if tokens and tokens[0] not in c.end_ids:
                    draft = Draft(tokens, [1.0] * len(tokens), score, (source, pos))
        draft = self._end_at_reply_end(draft)
        self._proposal = (len(self.context), draft)
        return draft

    def _end_at_reply_end(self, draft: Draft) -> Draft:
        """The draft up to and with its first token that ends the reply."""
        ends = self.config.end_ids
        for i, t in enumerate(draft.tokens if ends else ()):
            if t in ends:
                return Draft(draft.tokens[:i + 1], draft.probs[:i + 1], draft.match_len, draft.source)
        return draft

    def record(self, drafted: int, accepted: int) -> None:
        """One verify step: `accepted` of its `drafted` tokens matched what the model chose."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted ({accepted}) must be within 0..drafted ({drafted})")
        c = self.config
        self.stats.add_step(drafted, accepted)
        d, a = self._window[0] + drafted, self._window[1] + accepted
        self._window = (d, a)
        if d < c.probation:
            return
        self._window = (0, 0)
        if a < c.disable_below * d:
            self.paused_until = len(self.context) + self._pause
            self._pause = min(2 * self._pause, c.max_pause)
        else:
            self._pause = c.pause_tokens

    def finish(self) -> None:
        """The request ended: its output joins its tenant's recent outputs."""
        self.outputs.add(self.tenant, self.context[self.output_start:])
