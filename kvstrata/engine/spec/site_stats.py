"""How often the model agreed with a draft at each site of a request: the chance a drafted token is kept.

A draft source predicts well until it meets a place where the model writes something new: the id after
`"id": ` in a JSON list whose items the model counts up, the new name of a renamed identifier, the
branch of a loop the model takes this time. Those places repeat within a reply, and they are found by
what precedes them, so agreement is kept per *site*: the last `SITE_TOKENS` tokens before the drafted
position. A site seen before gives its own record (ok + PRIOR x r) / (ok + bad + PRIOR), where r is the
request's agreement over every position learned so far (a prior of 3 in 4); a new site gives r. A
draft's chances are the running product, so a draft is worth verifying up to just before the site
where it usually breaks, and the token there comes free as the model's own (the step's last row).

Every step teaches it, drafts verified or not: the drafter's whole proposal is compared with the
tokens the step emitted, up to the first difference (`learn`), so a site the cost model no longer drafts
past is still scored by the model's own next token. Learned per request (a site is a few tokens of one
request's text: nothing of it reaches another request).
"""
from __future__ import annotations

from typing import Sequence

SITE_TOKENS = 3  # tokens before a drafted position that name its site
PRIOR = 2.0  # weight (in observations) of the request's overall agreement at a site
MAX_SITES = 1 << 16  # sites kept per request; past it, sites seen once are forgotten


class SiteStats:
    def __init__(self) -> None:
        self._sites: dict[tuple[int, ...], list[int]] = {}  # site -> [agreed, disagreed]
        self.agreed = 0  # over every position learned
        self.seen = 0

    @property
    def overall(self) -> float:
        """The request's agreement at a drafted position, with a prior of 3 in 4."""
        return (self.agreed + 3) / (self.seen + 4)

    @staticmethod
    def _site(context: Sequence[int], draft: Sequence[int], j: int) -> tuple[int, ...]:
        """The SITE_TOKENS tokens before draft position j: the context's end, then draft[:j]."""
        need = SITE_TOKENS - min(j, SITE_TOKENS)
        head = tuple(context[max(0, len(context) - need):]) if need else ()
        return head + tuple(draft[max(0, j - SITE_TOKENS):j])

    def chances(self, context: Sequence[int], draft: Sequence[int]) -> list[float]:
        """For each drafted token, the chance it and every one before it are kept."""
        r, out, chance = self.overall, [], 1.0
        for j in range(len(draft)):
            ok, bad = self._sites.get(self._site(context, draft, j), (0, 0))
            chance *= (ok + PRIOR * r) / (ok + bad + PRIOR)
            out.append(chance)
        return out

    def learn(self, context: Sequence[int], proposal: Sequence[int], emitted: Sequence[int]) -> None:
        """A step after `context` emitted `emitted`; `proposal` is what the drafter offered there (verified
        or not). Each position up to the first difference is one observation of its site."""
        for j in range(min(len(proposal), len(emitted))):
            site = self._site(context, emitted, j)  # emitted[:j] == proposal[:j] here
            rec = self._sites.get(site)
            if rec is None:
                if len(self._sites) >= MAX_SITES:
                    self._forget()
                rec = self._sites[site] = [0, 0]
            same = proposal[j] == emitted[j]
            rec[0 if same else 1] += 1
            self.agreed += same
            self.seen += 1
            if not same:
                break

    def _forget(self) -> None:
        """Room for new sites: drop the ones seen once (or all, if every one was seen more)."""
        once = [s for s, (ok, bad) in self._sites.items() if ok + bad <= 1]
        for s in once or list(self._sites):
            del self._sites[s]

    def __len__(self) -> int:
        return len(self._sites)
