"""Class rooms: a teacher asks a question, phones vote, the teacher's page tallies and reveals.

One process holds every room, in memory, bounded and expiring (nothing of a room is kept once it ends):

    MAX_ROOMS        rooms open at once on this process (``EXPLORER_MAX_ROOMS``, default 50)
    ROOMS_PER_ADDRESS  rooms one network address may hold open at once (``EXPLORER_ROOMS_PER_ADDRESS``, default 5)
    MAX_VOTES        voters per question in one room (``EXPLORER_MAX_VOTES``, default 200)
    ROOM_MINUTES     a room ends this long after it opened (``EXPLORER_ROOM_MINUTES``, default 45)
    GRACE_MINUTES    ... or this long after its page last asked for its tally (``EXPLORER_ROOM_GRACE_MINUTES``,
                     default 5): the teacher's page polls it while open, so a closed tab frees its room
    2-6 choices      each at most 60 characters, made by the app (never a visitor's free text)

A room belongs to the lecturer's browser when the page sends its id (``open(owner=...)``, a random id the browser
keeps): asking again from that browser, after a reload too, asks in the same room while it lives.

A room code is 6 characters from a 31-letter alphabet without look-alikes (no 0/O, 1/I/L): 31**6 = 887,503,681
codes. The room is looked up first, so a correct code always joins, whatever was typed before it from the same
page or network; wrong codes are then limited per session (5 in 10 minutes) and per network address
(``EXPLORER_ROOM_WRONG_CODES``, default 30 in 10 minutes), each refusal a sentence. These limits cannot slow a
guesser, who learns from each answer whether a code was right: guessing is bounded by the code space against how
fast the server answers, and a found room gives a vote (within its network's share), never the tally or the reveal.

A session id costs a script nothing, so new voters are also limited per network address (an IPv6 address by
its /64, which one machine may rotate through), sized for a class behind one campus NAT:

    NEW_VOTERS_PER_ADDRESS   new voters one address may add to a room per ``NEW_VOTER_WINDOW`` (10 s)
                             (``EXPLORER_ROOM_NEW_VOTERS``, default 60: a class of 60 scanning the QR code at once)
    ADDRESS_SHARE            the share of ``MAX_VOTES`` one address's voters may take in a room
                             (``EXPLORER_ROOM_ADDRESS_SHARE``, default 0.75: 150 of 200, a lecture hall's
                             120 phones behind one campus address fit)

so a script rotating voter ids from one address holds at most three quarters of a room, and the rest stays for the phones
of other addresses; the teacher's page says when an address was refused. Phones behind the script's own address
share its share: nothing tells them apart from the script.

Only the session that opened a room holds its secret (a 32-byte token kept in that session's ``gr.State``,
never sent to a browser): revealing, closing and asking the next question need it; the room code does not
give it. A voter is one phone's browser id (``explorer.web.hall``): one vote per question, changeable until the
reveal; nobody but the room's owner sees the tally. A room keeps each earlier question's tally (at most
``MAX_PAST``), also across its lecturer's reload, for the page's CSV.

The store's guard is held only to read or write its books (microseconds), never while a model runs.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field


def _env_number(name: str, default: float, lo: float) -> float:
    try:
        return max(lo, float(os.environ.get(name, "") or default))
    except ValueError:  # a bad setting must not stop the app from starting
        return default


ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # 31 characters: no 0/O, no 1/I/L
CODE_LEN = 6
CODE_SPACE = len(ALPHABET) ** CODE_LEN
MAX_ROOMS = int(_env_number("EXPLORER_MAX_ROOMS", 50, 1))
MAX_VOTES = int(_env_number("EXPLORER_MAX_VOTES", 200, 1))
ROOM_MINUTES = _env_number("EXPLORER_ROOM_MINUTES", 45, 0.01)
GRACE_MINUTES = _env_number("EXPLORER_ROOM_GRACE_MINUTES", 5, 0.01)
ROOMS_PER_ADDRESS = int(_env_number("EXPLORER_ROOMS_PER_ADDRESS", 5, 1))
MIN_CHOICES, MAX_CHOICES, MAX_CHOICE_CHARS, MAX_QUESTION_CHARS = 2, 6, 60, 300
WRONG_PER_SESSION, WRONG_SESSION_WINDOW = 5, 600.0  # wrong codes one session may try, per 10 minutes
WRONG_PER_ADDRESS = int(_env_number("EXPLORER_ROOM_WRONG_CODES", 30, 1))  # per network, per WRONG_SESSION_WINDOW
NEW_VOTERS_PER_ADDRESS = int(_env_number("EXPLORER_ROOM_NEW_VOTERS", 60, 1))
NEW_VOTER_WINDOW = 10.0
ADDRESS_SHARE = min(1.0, _env_number("EXPLORER_ROOM_ADDRESS_SHARE", 0.75, 0.01))
MAX_PAST = 100  # questions of one room whose tallies are kept for its CSV (oldest dropped first)
MAX_GUESSERS = 10_000  # sessions (and networks) whose wrong codes are remembered (oldest forgotten first)

_CODE = re.compile(f"^[{ALPHABET}]{{{CODE_LEN}}}$")


def normalize(code) -> str:
    """A typed code as the store reads it: upper case, spaces and dashes dropped; ValueError with a sentence if it
    cannot be a code (such a code is not counted as a guess: it cannot open any room)."""
    if not isinstance(code, str):
        raise ValueError("Type the room code shown on the projector (6 letters and digits).")
    text = re.sub(r"[\s\-]", "", code).upper()
    if not text:
        raise ValueError("Type the room code shown on the projector (6 letters and digits).")
    if not _CODE.match(text):  # no code has 0, O, 1, I or L, and every code has 6 characters
        raise ValueError(f"A room code is {CODE_LEN} letters and digits without 0, O, 1, I or L: check the code on "
                         "the projector.")
    return text


@dataclass
class Question:
    """What voters see: a question and its choices (the app's words and the model's tokens, shown as text)."""
    qid: int
    text: str
    choices: tuple[str, ...]


@dataclass
class Tally:
    code: str
    qid: int
    text: str
    choices: tuple[str, ...]
    counts: tuple[int, ...]
    revealed: bool
    version: int  # changes with every vote counted, so a page redraws only when something changed
    seconds_left: float
    refused: int = 0  # new voters refused because their address sent too many (a script, most likely)

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass
class _Room:
    code: str
    secret: str
    expires: float
    question: Question
    votes: dict = field(default_factory=dict)  # voter -> choice index
    revealed: bool = False
    version: int = 0
    voters: dict = field(default_factory=dict)  # voter -> network, every voter admitted (kept across questions)
    per_network: dict = field(default_factory=dict)  # network -> how many voters it holds in this room
    arrivals: dict = field(default_factory=dict)  # network -> deque of when its voters were admitted
    refused: int = 0
    seen: float = 0.0  # when the owner's page last asked for the tally (or asked, revealed)
    owner: str | None = None  # a digest of the lecturer's browser id, when the page sent one
    network: str | None = None  # the network address that opened it
    past: list = field(default_factory=list)  # the tallies of the room's earlier questions, oldest first


def check_question(text, choices) -> tuple[str, tuple[str, ...]]:
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_QUESTION_CHARS:
        raise ValueError(f"A question is 1 to {MAX_QUESTION_CHARS} characters of text.")
    choices = tuple(choices)
    if not MIN_CHOICES <= len(choices) <= MAX_CHOICES:
        raise ValueError(f"A question has {MIN_CHOICES} to {MAX_CHOICES} choices, not {len(choices)}.")
    if any(not isinstance(c, str) or not c or len(c) > MAX_CHOICE_CHARS for c in choices):
        raise ValueError(f"Each choice is 1 to {MAX_CHOICE_CHARS} characters of text.")
    if len(set(choices)) != len(choices):
        raise ValueError("Two choices read the same: a question needs choices a voter can tell apart.")
    return text, choices


class Rooms:
    """Every room of this process. ``clock`` is injectable so tests can expire rooms without waiting."""

    def __init__(self, *, max_rooms: int = MAX_ROOMS, max_votes: int = MAX_VOTES, minutes: float = ROOM_MINUTES,
                 clock=time.monotonic, new_voters_per_window: int = NEW_VOTERS_PER_ADDRESS,
                 address_share: float = ADDRESS_SHARE, grace_minutes: float = GRACE_MINUTES,
                 rooms_per_address: int = ROOMS_PER_ADDRESS, wrong_per_address: int = WRONG_PER_ADDRESS) -> None:
        self.max_rooms, self.max_votes, self.minutes, self.clock = max_rooms, max_votes, minutes, clock
        self.new_voters_per_window, self.address_share = new_voters_per_window, address_share
        self.grace_minutes, self.rooms_per_address = grace_minutes, rooms_per_address
        self.wrong_per_address = wrong_per_address
        self._rooms: dict[str, _Room] = {}
        self._guard = threading.Lock()
        self._wrong: "OrderedDict[str, deque]" = OrderedDict()  # session -> times of its wrong codes
        self._wrong_net: "OrderedDict[str, deque]" = OrderedDict()  # network -> times of its wrong codes
        self._next_qid = 1

    # --- books, under the guard ---------------------------------------------------------------------------
    def _ends(self, room: _Room) -> float:
        return min(room.expires, room.seen + self.grace_minutes * 60)

    def _sweep(self, now: float) -> None:
        for code in [c for c, r in self._rooms.items() if self._ends(r) <= now]:
            del self._rooms[code]  # nothing of an ended room is kept

    def _live(self, code, now: float) -> _Room | None:
        """The room of ``code`` once ended rooms are swept, or None (a code that is no string names none)."""
        self._sweep(now)
        return self._rooms.get(code) if isinstance(code, str) else None

    def _joined(self, code, now: float) -> _Room:
        """``_live``'s room for a phone; ValueError with a sentence when it has ended or never was."""
        room = self._live(code, now)
        if room is None:
            raise ValueError("This room has ended (or the code is wrong): type the code on the projector again.")
        return room

    def _new_question(self, text: str, choices: tuple[str, ...]) -> Question:
        qid, self._next_qid = self._next_qid, self._next_qid + 1
        return Question(qid, text, choices)

    def _owned(self, code: str, secret, now: float) -> _Room:
        """The room, for its owner's page (which keeps it alive by asking); ValueError otherwise."""
        room = self._rooms.get(code) if isinstance(code, str) else None
        if room is None:
            raise ValueError(f"Room {code} has ended (a room lasts {self.minutes:g} minutes, ends "
                             f"{self.grace_minutes:g} minutes after its page is closed, or when it is closed): ask "
                             "the class again to open a new one.")
        if not isinstance(secret, str) or not hmac.compare_digest(room.secret, secret):
            raise ValueError("Only the page that asked this question can reveal it, close it or ask the next one.")
        room.seen = now
        return room

    def _put(self, room: _Room, text: str, choices: tuple[str, ...], now: float) -> int:
        room.past = [*room.past, self._tally(room, now)][-MAX_PAST:]  # a reopen by its lecturer keeps them too
        room.question, room.votes, room.revealed = self._new_question(text, choices), {}, False
        room.version, room.seen = room.version + 1, now
        return room.question.qid

    def _tally(self, room: _Room, now: float) -> Tally:
        counts = [0] * len(room.question.choices)
        for choice in room.votes.values():
            counts[choice] += 1
        return Tally(room.code, room.question.qid, room.question.text, room.question.choices, tuple(counts),
                     room.revealed, room.version, max(0.0, room.expires - now), room.refused)

    def _admit(self, room: _Room, voter: str, address: str, now: float) -> None:
        """Admit a new voter from ``address`` to ``room``, or count a refusal and raise ValueError with a sentence
        when that address's voters came too fast or hold their share of the room already."""
        net = network(address)
        arrived = room.arrivals.get(net)
        while arrived and arrived[0] <= now - NEW_VOTER_WINDOW:
            arrived.popleft()
        share = max(1, int(self.address_share * self.max_votes))
        if len(room.voters) >= 4 * self.max_votes:  # the books of who voted stay bounded, whatever the addresses
            raise ValueError(f"This room has seen {len(room.voters)} voters, its limit: your vote was not counted.")
        if room.per_network.get(net, 0) >= share:
            room.refused, room.version = room.refused + 1, room.version + 1
            raise ValueError(f"This room already counts {share} voters from your network, its share of the room: "
                             "your vote was not counted. Tell your teacher.")
        if arrived is not None and len(arrived) >= self.new_voters_per_window:
            room.refused, room.version = room.refused + 1, room.version + 1
            raise ValueError(f"{self.new_voters_per_window} new voters from your network joined this room in the "
                             f"last {NEW_VOTER_WINDOW:g} seconds: wait a few seconds and tap your answer again.")
        room.arrivals.setdefault(net, deque()).append(now)
        room.per_network[net] = room.per_network.get(net, 0) + 1
        room.voters[voter] = net

    @staticmethod
    def _recent(book: "OrderedDict[str, deque]", key, now: float) -> int:
        times = book.get(key)
        while times and times[0] <= now - WRONG_SESSION_WINDOW:
            times.popleft()
        return len(times) if times else 0

    def _refuse_guessing(self, voter: str, net: str | None, now: float) -> None:
        """Only for a code no open room has: a correct code never reaches here."""
        if self._recent(self._wrong, voter, now) >= WRONG_PER_SESSION:
            raise ValueError(f"{WRONG_PER_SESSION} wrong room codes from this page in 10 minutes: check the code on "
                             "the projector, or open its link or QR code.")
        if net is not None and self._recent(self._wrong_net, net, now) >= self.wrong_per_address:
            raise ValueError(f"{self.wrong_per_address} wrong room codes from your network in 10 minutes: check the "
                             "code on the projector, or open its link or QR code (the right code still joins).")

    def _count_wrong(self, voter: str, net: str | None, now: float) -> None:
        for book, key in ((self._wrong, voter), (self._wrong_net, net)):
            if key is None:
                continue
            times = book.pop(key, None) or deque()
            times.append(now)
            book[key] = times
            while len(book) > MAX_GUESSERS:
                book.popitem(last=False)

    # --- the teacher's page ---------------------------------------------------------------------------------
    def open(self, text: str, choices, *, owner: str | None = None, address: str | None = None
             ) -> tuple[str, str, int]:
        """A room with this question: (code, secret, question id). ``owner``: the lecturer's browser id; while a
        room it opened lives, the question is asked there (votes start again). ``address``: the network address
        asking, held to ``rooms_per_address``. ValueError with a sentence when the process or the address is full."""
        text, choices = check_question(text, choices)
        key = hashlib.sha256(owner.encode()).hexdigest() if isinstance(owner, str) and owner else None
        net = None if address is None else network(address)
        now = self.clock()
        with self._guard:
            self._sweep(now)
            mine = next((r for r in self._rooms.values() if key is not None and r.owner == key), None)
            if mine is not None:  # the lecturer's reload, or a second Ask after its page lost the room's key
                return mine.code, mine.secret, self._put(mine, text, choices, now)
            if len(self._rooms) >= self.max_rooms:
                oldest = min(r.expires for r in self._rooms.values()) - now
                raise ValueError(f"This server already holds {self.max_rooms} class rooms, its limit: a room ends "
                                 f"{self.grace_minutes:g} min after its page is closed, and the oldest in at most "
                                 f"{max(1, round(oldest / 60))} min; try again then, or run your own copy.")
            if net is not None and sum(r.network == net for r in self._rooms.values()) >= self.rooms_per_address:
                raise ValueError(f"Your network address already holds {self.rooms_per_address} open class rooms, "
                                 "its limit: close one (\"Close the room\" on its page), or wait: a room ends "
                                 f"{self.grace_minutes:g} min after its page is closed.")
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            while code in self._rooms:
                code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            secret = secrets.token_urlsafe(32)
            question = self._new_question(text, choices)
            self._rooms[code] = _Room(code, secret, now + self.minutes * 60, question, seen=now, owner=key,
                                      network=net)
            return code, secret, question.qid

    def ask(self, code: str, secret: str, text: str, choices) -> int:
        """The next question in the owner's room (votes start again from none); its id."""
        text, choices = check_question(text, choices)
        now = self.clock()
        with self._guard:
            self._sweep(now)
            return self._put(self._owned(code, secret, now), text, choices, now)

    def tally(self, code: str, secret: str) -> Tally:
        """The tally as it stands; asking for it is what keeps the room alive (its page polls it)."""
        now = self.clock()
        with self._guard:
            self._sweep(now)
            return self._tally(self._owned(code, secret, now), now)

    def reveal(self, code: str, secret: str) -> Tally:
        """Votes closed for this question; the tally as it stands."""
        now = self.clock()
        with self._guard:
            self._sweep(now)
            room = self._owned(code, secret, now)
            if not room.revealed:
                room.revealed, room.version = True, room.version + 1
            return self._tally(room, now)

    def close(self, code: str, secret: str) -> None:
        now = self.clock()
        with self._guard:
            self._sweep(now)
            self._owned(code, secret, now)
            del self._rooms[code]

    # --- a voter's phone ------------------------------------------------------------------------------------
    def join(self, code, voter: str, address: str | None = None) -> Question:
        """The room's current question for a voter. ValueError with a sentence for a bad, unknown or ended code.
        ``address``: the voter's network address, whose wrong codes are limited (None: only the session's are)."""
        typed = normalize(code)
        now = self.clock()
        with self._guard:
            self._sweep(now)
            room = self._rooms.get(typed)
            if room is not None:  # looked up first: nobody's wrong codes ever keep a right one out
                return room.question
            net = None if address is None else network(address)
            self._refuse_guessing(voter, net, now)
            self._count_wrong(voter, net, now)
            raise ValueError(f"No open room has the code {typed}: check the code on the projector (rooms end "
                             f"{self.minutes:g} minutes after they open, or when the teacher closes them).")

    def vote(self, code: str, voter: str, qid, choice, address: str | None = None) -> tuple[Question, int]:
        """Count ``voter``'s choice (replacing their earlier one) for question ``qid``: (question, choice).
        ``address``: the voter's network address, for the limits on new voters per address (None: none apply)."""
        now = self.clock()
        with self._guard:
            room = self._joined(code, now)
            q = room.question
            if qid != q.qid:
                raise ValueError("The teacher has asked a new question: here it is; vote again.")
            if room.revealed:
                raise ValueError("The answer has been revealed: votes are closed for this question.")
            if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(q.choices):
                raise ValueError(f"Choose one of the {len(q.choices)} answers shown.")
            if voter not in room.votes and len(room.votes) >= self.max_votes:
                raise ValueError(f"This room has {self.max_votes} votes, its limit: your vote was not counted.")
            if address is not None and voter not in room.voters:
                self._admit(room, voter, address, now)
            if room.votes.get(voter) != choice:
                room.votes[voter] = choice
                room.version += 1
            return q, choice

    def current(self, code: str) -> tuple[Question, bool] | None:
        """(the room's question, whether it is revealed) for a phone already in the room; None once it has ended.
        Only for codes a join accepted (kept in the phone's server-side state): no guess is counted here."""
        with self._guard:
            room = self._live(code, self.clock())
            return None if room is None else (room.question, room.revealed)

    # --- the phone page (explorer.web.hall) ----------------------------------------------------------------------
    def admit(self, code: str, voter: str, address: str) -> None:
        """Admit ``voter`` from ``address`` to the room now (when its phone opens the room, not at its first vote,
        so a class scanning the QR code over a minute meets the per-address limits then, not all at the first
        question); nothing when already admitted. ValueError with a sentence as ``vote`` refuses a new voter."""
        now = self.clock()
        with self._guard:
            room = self._joined(code, now)
            if voter not in room.voters:
                self._admit(room, voter, address, now)

    def phone_view(self, code: str, voter: str | None) -> tuple[Question, bool, int | None] | None:
        """(the room's question, whether it is revealed, ``voter``'s choice for it or None); None once the room has
        ended. Only for codes a join accepted: no guess is counted here."""
        with self._guard:
            room = self._live(code, self.clock())
            if room is None:
                return None
            return room.question, room.revealed, room.votes.get(voter) if voter is not None else None

    def tallies(self, code: str, secret: str) -> list[Tally]:
        """Every question of the owner's room, oldest first, the current one last: counts only, no voter."""
        now = self.clock()
        with self._guard:
            self._sweep(now)
            room = self._owned(code, secret, now)
            return [*room.past, self._tally(room, now)]

    def __len__(self) -> int:
        with self._guard:
            self._sweep(self.clock())
            return len(self._rooms)


def network(address: str) -> str:
    """What the limits per address count: an IPv4 address itself, an IPv6 address by its /64 (one machine is
    commonly given a whole /64), anything else (a host name, "unknown") as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


#: The process's rooms (one process holds them all: with several replicas, a room lives on the one that opened it).
rooms = Rooms()
