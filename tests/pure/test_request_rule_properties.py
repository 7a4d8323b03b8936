"""``keeper.model.request_rule`` as its contract (docs/design.md §8.6): what the front door's rule
promises, each property over every ``SoFar`` hypothesis builds, then over whole requests: a small
simulation of the front door feeds the rule's answer back to it, hypothesis choosing what the
service's view says and what each attempt comes to, and every request ends within a bound.

No reference here (``test_request_rule.py`` has one): each property says one thing an engineer
relies on, in its name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from hypothesis import given
from hypothesis import strategies as st

from keeper.model.request_rule import (
    OUTCOMES,
    TRANSIENT,
    Action,
    Done,
    Fail,
    Happened,
    Hold,
    PassOn,
    Send,
    SoFar,
    next_action,
    outcome,
)

HAPPENED: tuple[Happened, ...] = get_args(Happened)
# exo's troubles that are waited out even for a model with no deployment: exo's 404 for want of
# an instance is not one of them (nothing is coming to serve it, §8.6).
EXOS_OWN_TROUBLE: frozenset[Happened] = TRANSIENT - {"no_instance"}


@st.composite
def so_fars(draw: st.DrawFn) -> SoFar:
    """Every SoFar: each field free, and the hold's edge (waited exactly the hold, a hair less)
    often. The reference in ``test_request_rule.py`` is checked over these too."""
    hold_s = draw(st.one_of(st.just(0.0), st.floats(0, 120, allow_nan=False)))
    held_s = draw(
        st.one_of(
            st.just(hold_s),
            st.just(max(0.0, math.nextafter(hold_s, 0.0))),
            st.floats(0, 240, allow_nan=False),
        )
    )
    return SoFar(
        last=draw(st.sampled_from((None, *HAPPENED))),
        deployed=draw(st.booleans()),
        serving=draw(st.booleans()),
        first_token_sent=draw(st.booleans()),
        exact=draw(st.booleans()),
        cuts=draw(st.integers(0, 6)),
        held_s=held_s,
        hold_s=hold_s,
        max_migrations=draw(st.integers(0, 5)),
        held=draw(st.booleans()),
        sends=draw(st.integers(0, 8)),
        continuations=draw(st.integers(0, 5)),
        paused=draw(st.booleans()),
    )


# --- what the client has is never repeated, and never dropped in silence ------------------------


@given(so_fars())
def test_once_the_first_token_is_sent_a_send_is_always_a_continuation(so_far: SoFar) -> None:
    assert next_action(replace(so_far, first_token_sent=True)) != Send(continuation=False)


@given(so_fars())
def test_a_continuation_is_sent_only_when_the_client_has_part_of_the_answer(s: SoFar) -> None:
    assert next_action(replace(s, first_token_sent=False)) != Send(continuation=True)


@given(so_fars())
def test_exos_answer_is_passed_on_only_before_the_first_token(so_far: SoFar) -> None:
    # Once the client has a 200 and part of the answer, exo's status cannot be its answer.
    assert next_action(replace(so_far, first_token_sent=True)) != PassOn()


@given(so_fars())
def test_exos_answer_is_passed_on_only_for_a_refusal_or_a_404_nothing_will_serve(
    so_far: SoFar,
) -> None:
    if next_action(so_far) == PassOn():
        assert so_far.last == "refused" or (so_far.last == "no_instance" and not so_far.deployed)


@given(so_fars())
def test_a_cut_after_the_first_token_that_cannot_be_exact_always_fails(so_far: SoFar) -> None:
    cut = replace(so_far, last="cut", first_token_sent=True, exact=False)
    assert next_action(cut) == Fail("inexact")


@given(so_fars())
def test_a_cut_is_never_sent_again_past_max_migrations(so_far: SoFar) -> None:
    cut = replace(so_far, last="cut", cuts=so_far.max_migrations + 1 + so_far.cuts)
    assert next_action(cut) in (Fail("cuts"), Fail("inexact"))


@given(so_fars())
def test_a_cut_within_max_migrations_that_can_go_on_is_sent_again(so_far: SoFar) -> None:
    # Never a silent truncation: a continuation that can be exact (or a request the client has
    # nothing of) is sent again, at once or once its deployment serves.
    cut = replace(so_far, last="cut", cuts=min(so_far.cuts, so_far.max_migrations))
    if cut.exact or not cut.first_token_sent:
        assert next_action(cut) in (Send(cut.first_token_sent), Hold())


# --- nothing waits for ever, and nothing waits for no reason ------------------------------------


@given(so_fars())
def test_no_request_is_held_once_it_has_waited_its_hold(so_far: SoFar) -> None:
    spent = replace(so_far, held_s=max(so_far.held_s, so_far.hold_s))
    assert next_action(spent) != Hold()


@given(so_fars())
def test_a_transient_trouble_past_the_hold_is_neither_held_nor_sent_again(s: SoFar) -> None:
    for last in TRANSIENT:
        action = next_action(replace(s, last=last, held_s=s.hold_s + s.held_s))
        assert action == Fail("not_serving") or (last == "no_instance" and not s.deployed)
        assert isinstance(action, Fail | PassOn)


@given(so_fars())
def test_a_503_for_not_serving_comes_only_once_the_hold_is_spent(so_far: SoFar) -> None:
    if next_action(so_far) == Fail("not_serving"):
        assert so_far.held_s >= so_far.hold_s
        assert so_far.last in TRANSIENT


@given(so_fars())
def test_exos_trouble_within_the_hold_is_waited_out_or_sent_again(so_far: SoFar) -> None:
    if so_far.held_s < so_far.hold_s:
        for last in TRANSIENT - ({"no_instance"} if not so_far.deployed else set()):
            action = next_action(replace(so_far, last=last))
            assert action in (Hold(), Send(so_far.first_token_sent))


@given(so_fars())
def test_exos_trouble_is_waited_on_a_moment_before_the_request_goes_again(s: SoFar) -> None:
    # Sent again at once, a request would find exo, just elected, as it left it.
    for last in TRANSIENT:
        assert not isinstance(next_action(replace(s, last=last, paused=False)), Send)


@given(so_fars())
def test_a_request_is_held_only_for_its_deployment_or_a_moment_after_exos_trouble(
    so_far: SoFar,
) -> None:
    if next_action(so_far) == Hold():
        assert so_far.held_s < so_far.hold_s
        for_deployment = so_far.deployed and not so_far.serving
        a_moment = so_far.last in TRANSIENT and not so_far.paused
        assert for_deployment or a_moment


@given(so_fars())
def test_a_model_with_no_deployment_is_never_held_but_a_moment_after_a_5xx_or_no_connection(
    so_far: SoFar,
) -> None:
    # Nothing is coming to serve it, so it never waits for its deployment; exo's 404 is passed on
    # at once. exo's own trouble (a 5xx, no connection) is any request's to wait out a moment.
    undeployed = replace(so_far, deployed=False)
    if next_action(undeployed) == Hold():
        assert undeployed.last in EXOS_OWN_TROUBLE and not undeployed.paused


@given(so_fars())
def test_a_model_with_no_deployment_gets_exos_404_at_once(so_far: SoFar) -> None:
    lost = replace(so_far, last="no_instance", deployed=False, first_token_sent=False)
    assert next_action(lost) == PassOn()


@given(so_fars())
def test_a_new_request_is_never_refused_only_sent_or_held(so_far: SoFar) -> None:
    assert isinstance(next_action(replace(so_far, last=None)), Send | Hold)


@given(so_fars())
def test_a_new_request_that_nothing_stops_is_sent_at_once(so_far: SoFar) -> None:
    new = replace(so_far, last=None, first_token_sent=False)
    if new.serving or not new.deployed:
        assert next_action(new) == Send(continuation=False)


@given(so_fars(), st.floats(0, 300, allow_nan=False))
def test_waiting_longer_never_undoes_an_end_nor_brings_a_hold(s: SoFar, more: float) -> None:
    now, later = next_action(s), next_action(replace(s, held_s=s.held_s + more))
    if isinstance(now, Done | Fail | PassOn):
        assert later == now
    if later == Hold():
        assert now == Hold()


@given(so_fars(), st.integers(1, 5))
def test_more_cuts_never_undo_a_failure(so_far: SoFar, more: int) -> None:
    now = next_action(so_far)
    if isinstance(now, Fail):
        assert next_action(replace(so_far, cuts=so_far.cuts + more)) == now


# --- how it ends --------------------------------------------------------------------------------


WHY_FROM: dict[str, tuple[Happened, ...]] = {
    "not_serving": tuple(TRANSIENT),
    "cuts": ("cut",),
    "inexact": ("cut",),
    "garbage": ("garbage",),
    # exo's refusal of a continuation, or its 404 for a model whose deployment went meanwhile
    "refused_mid_stream": ("refused", "no_instance"),
}


@given(so_fars())
def test_answered_always_ends_done_with_the_outcome_it_is_counted_by(so_far: SoFar) -> None:
    answered = replace(so_far, last="answered")
    assert next_action(answered) == Done(outcome(answered))


@given(so_fars())
def test_a_client_gone_always_ends_cancelled(so_far: SoFar) -> None:
    assert next_action(replace(so_far, last="client_gone")) == Done("cancelled")


@given(so_fars())
def test_an_unreadable_answer_always_fails(so_far: SoFar) -> None:
    assert next_action(replace(so_far, last="garbage")) == Fail("garbage")


@given(so_fars())
def test_a_refusal_is_exos_answer_before_the_first_token_and_an_error_event_after(
    so_far: SoFar,
) -> None:
    refused = replace(so_far, last="refused")
    after = Fail("refused_mid_stream") if refused.first_token_sent else PassOn()
    assert next_action(refused) == after


@given(so_fars())
def test_a_request_is_done_only_when_answered_or_its_client_left(so_far: SoFar) -> None:
    if isinstance(next_action(so_far), Done):
        assert so_far.last in ("answered", "client_gone")


@given(so_fars())
def test_a_failure_says_what_the_last_attempt_came_to(so_far: SoFar) -> None:
    action = next_action(so_far)
    if isinstance(action, Fail):
        assert so_far.last in WHY_FROM[action.why]


@given(so_fars())
def test_what_is_counted_never_changes_the_next_step(so_far: SoFar) -> None:
    # held, sends and continuations are how an answer is counted, not what happens to it.
    if so_far.last != "answered":
        recounted = replace(so_far, held=not so_far.held, sends=0, continuations=0)
        assert next_action(recounted) == next_action(so_far)


@given(so_fars())
def test_an_answers_outcome_names_the_most_that_happened_to_it(so_far: SoFar) -> None:
    counted = outcome(so_far)
    assert counted in OUTCOMES
    assert (counted == "migrated") == (so_far.continuations > 0)
    assert (counted == "retried") == (so_far.continuations == 0 and so_far.sends > 1)
    assert (counted == "held") == (so_far.continuations == 0 and so_far.sends <= 1 and so_far.held)


# --- whole requests -----------------------------------------------------------------------------

# The front door looks at a held request again this often (§8.6: every 0.5 s), and never past
# what is left of its hold: a Hold takes the clock on by the smaller of the two.
RECHECK_S = 0.5
# What the service's view of the model's deployment does during one request.
View = Literal["serving", "down", "none", "changing"]


@dataclass
class Request:
    """One chat through the front door, kept as the shell keeps it (§8.6): the rule's answer fed
    back, hypothesis choosing the view and what each attempt comes to."""

    hold_s: float
    max_migrations: int
    exact: bool
    # How long it has waited without progress: since its arrival, or the last chunk the client
    # got (the shell's ``now - since``, kept as one sum: two clock readings far from 0 lose the
    # last hair of a hold to rounding, and a hold that cannot take the clock on is never over).
    waited: float = 0.0
    last: Happened | None = None
    deployed: bool = True
    serving: bool = True
    first_token_sent: bool = False
    cuts: int = 0
    sends: int = 0
    continuations: int = 0
    held: bool = False
    paused: bool = False
    steps: list[tuple[SoFar, Action]] = field(default_factory=list[tuple[SoFar, Action]])

    def so_far(self) -> SoFar:
        return SoFar(
            last=self.last,
            deployed=self.deployed,
            serving=self.serving,
            first_token_sent=self.first_token_sent,
            exact=self.exact,
            cuts=self.cuts,
            held_s=self.waited,
            hold_s=self.hold_s,
            max_migrations=self.max_migrations,
            held=self.held,
            sends=self.sends,
            continuations=self.continuations,
            paused=self.paused,
        )

    @property
    def end(self) -> Action:
        return self.steps[-1][1]

    @property
    def sent(self) -> list[tuple[SoFar, Send]]:
        return [(s, a) for s, a in self.steps if isinstance(a, Send)]


def most_steps(hold_s: float, max_migrations: int) -> int:
    """The bound a request ends within. Its wait (since its last chunk) is at most
    ``ceil(hold_s / RECHECK_S) + 1`` holds, each send inside it that brings no chunk is a trouble
    of exo's (then a hold, or the end past the hold) or a cut (``max_migrations + 1`` at most);
    a new wait starts only after a cut that brought chunks. Twice that, to spare."""
    holds = math.ceil(hold_s / RECHECK_S) + 1
    waits = max_migrations + 2
    cuts = max_migrations + 1
    return 2 * (waits * (2 * holds + 1) + cuts + 1)


def simulate(data: st.DataObject, view: View | None = None) -> Request:
    request = Request(
        hold_s=data.draw(st.sampled_from([0.0, 0.5, 1.7, 6.0, 30.0]) | st.floats(0, 12)),
        max_migrations=data.draw(st.integers(0, 3)),
        exact=data.draw(st.booleans()),  # n > 1 or logprobs asked: never exact
    )
    if view is None:
        view = data.draw(st.sampled_from(get_args(View)))
    request.deployed = view != "none"
    request.serving = view == "serving"
    for _ in range(most_steps(request.hold_s, request.max_migrations)):
        if view == "changing":
            request.deployed = data.draw(st.booleans())
            request.serving = request.deployed and data.draw(st.booleans())
        so_far = request.so_far()
        action = next_action(so_far)
        request.steps.append((so_far, action))
        if isinstance(action, Done | Fail | PassOn):
            return request
        if isinstance(action, Hold):
            request.waited += min(RECHECK_S, so_far.hold_s - so_far.held_s)
            request.held = request.paused = True
            continue
        request.sends += 1
        request.continuations += action.continuation
        request.paused = False
        happened = data.draw(st.sampled_from(HAPPENED))
        request.waited += data.draw(st.floats(0, 5))  # the attempt's own time
        # An answer reaches the client; a cut, an unreadable event or a client leaving may come
        # after some chunks; exo's refusals and troubles bring none.
        brought = happened == "answered" or (
            happened in ("cut", "garbage", "client_gone") and data.draw(st.booleans())
        )
        if brought:
            request.first_token_sent = True
            # its last chunk came this long before it ended (silent up to 30 s, then cut)
            request.waited = data.draw(st.floats(0, 30))
            # tool calls or reasoning in the chunks make a continuation inexact
            request.exact = request.exact and data.draw(st.booleans())
        request.cuts += happened == "cut"
        request.last = happened
    raise AssertionError(f"no end in {len(request.steps)} steps: {request.steps[-6:]}")


@given(st.data())
def test_every_request_ends_within_a_bound_of_steps(data: st.DataObject) -> None:
    # simulate raises past the bound: no request hangs for ever while its hold is bounded.
    request = simulate(data)
    assert isinstance(request.end, Done | Fail | PassOn)


@given(st.data())
def test_a_request_is_cut_and_sent_again_at_most_max_migrations_times(data: st.DataObject) -> None:
    request = simulate(data)
    after_cuts = [s for s, _ in request.sent if s.last == "cut"]
    assert len(after_cuts) <= request.max_migrations
    # A continuation goes after a cut, or again after exo did not take it (its 404 or 5xx, or
    # no connection: the same continuation, not another migration).
    for so_far, send in request.sent:
        if send.continuation:
            assert so_far.last == "cut" or so_far.last in TRANSIENT


@given(st.data())
def test_a_requests_answer_is_never_started_twice(data: st.DataObject) -> None:
    request = simulate(data)
    fresh = [s for s, send in request.sent if not send.continuation]
    assert all(not s.first_token_sent for s in fresh)
    # Every attempt before the first chunk is a fresh one, every one after a continuation.
    assert all(send.continuation == s.first_token_sent for s, send in request.sent)


@given(st.data())
def test_an_answered_request_is_counted_by_what_happened_to_it(data: st.DataObject) -> None:
    request = simulate(data)
    if request.last != "answered":
        return
    actions = [action for _, action in request.steps]
    if any(isinstance(a, Send) and a.continuation for a in actions):
        expected = "migrated"
    elif sum(isinstance(a, Send) for a in actions) > 1:
        expected = "retried"
    elif Hold() in actions:
        expected = "held"
    else:
        expected = "ok"
    assert request.end == Done(expected)


@given(st.data())
def test_a_request_ends_as_its_last_attempt_says(data: st.DataObject) -> None:
    request = simulate(data)
    last, end = request.steps[-1]
    if isinstance(end, Done):
        assert last.last in ("answered", "client_gone")
        assert (end.outcome == "cancelled") == (last.last == "client_gone")
    if isinstance(end, PassOn):
        assert not last.first_token_sent
    if end == Fail("not_serving"):
        # refused with a 503 only once exo's trouble outlasted the whole hold
        assert last.held_s >= request.hold_s
    if end == Fail("cuts"):
        assert request.cuts == request.max_migrations + 1
    if end == Fail("inexact"):
        assert last.first_token_sent and not request.exact


@given(st.data())
def test_a_model_with_no_deployment_waits_only_a_moment_per_trouble_of_exos(
    data: st.DataObject,
) -> None:
    request = simulate(data, view="none")
    troubles = sum(s.last in EXOS_OWN_TROUBLE for s, _ in request.steps)
    holds = sum(action == Hold() for _, action in request.steps)
    assert holds <= troubles
    assert request.steps[0][1] == Send(continuation=False)
    if request.last == "no_instance":
        assert request.end in (PassOn(), Fail("refused_mid_stream"))


@given(st.data())
def test_a_request_to_a_serving_deployment_that_exo_answers_is_ok(data: st.DataObject) -> None:
    request = simulate(data, view="serving")
    if request.sends == 1 and request.last == "answered":
        assert request.end == Done("ok")
