/*
 * identity.outbox: its writers, relays, lanes, floor, cursors, back-read and lane
 * hand-over, for the spin model checker (README.md beside this file).
 *
 *   -DBACKREAD  the protocol before the frontier (floor.py, floor.sql in git history)
 *   -DFRONTIER   the frontier (the default)
 *   -DNOSTATS   BACKREAD: the relay's login lacks pg_read_all_stats
 *
 * What is checked (each alone, so that each is counted on its own):
 *   -DCHECK_ORDER  G2, assertions: at a produce, at a first acknowledgement, at an append
 *   -DCHECK_FLOOR  floor safety, an invariant (the monitor process FloorSafety)
 *   ltl g1         G1, no row stuck: pan -a -f (weak fairness), compiled without NOCLAIM
 *
 * Variants of the new design that must fail (each one a rule of the design taken away):
 *   -DHOLDERS_FIRST   the frontier step reads the holders before the last id
 *   -DID_BEFORE_LOCK  the writers' trigger takes the id before the writer lock
 *   -DNAIVE_LIMIT     a read cut by its LIMIT still moves the cursors of the slots it did
 *                     not truncate up to their frontier
 *   -DNO_FIRST_WAIT   a holder that shows no first id yet does not hold the slot back
 */

#if !defined(BACKREAD) && !defined(FRONTIER)
#define FRONTIER
#endif
#if defined(BACKREAD) && defined(FRONTIER)
#error "BACKREAD or FRONTIER, not both"
#endif

#ifndef LIMIT
#define LIMIT 2          /* rows a read returns at most (RELAY_BATCH_SIZE) */
#endif

#define NW     3         /* writer transactions W1 W2 W3 */
#define NR     2         /* relays R1 R2 */
#define NID    3         /* ids 1..3: one row per writer transaction */
#define NKEY   2
#define NSLOT  2         /* the slots with rows: A's and B's */
#define WMAX   NKEY      /* the in-flight window: at most one record per key */
#define NONE   255       /* no cursor: read from the floor */

/* Keys, slots, lanes: A in slot 0, B in slot 2, both lane 0 (slot % 2). Lane 1 (slot 1)
 * gets no row and is left out. Slot arrays are indexed by key (SLOT(k) == k); SLOTNO is
 * the slot's number. */
#define KA 0
#define KB 1
#define SLOT(k)   (k)
#define SLOTNO(s) ((s) * 2)
#define LANE0     1      /* lane mask */

/* Rows (by id) */
#define R_NONE   0       /* id not handed out */
#define R_OPEN   1       /* inserted, its transaction open: invisible */
#define R_PREP   2       /* its transaction prepared: invisible */
#define R_COMM   3       /* committed and still in the outbox: visible */
#define R_GONE   4       /* acknowledged by Kafka and deleted */
#define R_ABORT  5       /* rolled back: never exists */

/* Writer transactions */
#define T_IDLE   0
#define T_BEGUN  1       /* BACKREAD: BEGIN, no id, no xid (idle in transaction) */
#define T_LOCKED 2       /* FRONTIER: holds its slot's writer lock, no id yet */
#define T_INS    3       /* took its id and inserted: holds an xid */
#define T_PREP   4       /* prepared: no session; the transaction and its locks are kept */
#define T_DONE   5       /* committed or rolled back, its locks released */

/* Records in Kafka */
#define K_NONE   0
#define K_FLIGHT 1       /* produced, no outcome yet */
#define K_ACKED  2       /* acknowledged by the broker */

byte last;                   /* pg_sequence_last_value: the last id handed out (cache 1) */
byte rkey[NID + 1];
byte rst[NID + 1];
byte ts[NW];
bit  w1stays;                /* W1 stays open for good (and W2 never begins) */
byte tsu;                    /* U: an unrelated transaction, no writer lock */
#ifdef FRONTIER
byte hold[NSLOT];            /* pg_locks: holders of each slot's writer lock (bit t) */
byte fid[NW];                /* pg_locks: the first id each writer shows (0: none, yet) */
#endif

/* Relays */
byte held[NR];               /* lanes whose slot locks the relay holds */
byte rel[NR];                /* lanes marked for hand-over: not read, given back when idle */
bit  handreq;                /* the lanes' plan moved lane 0 from R1 to R2 (once, or never) */
#ifdef BACKREAD
#define NCUR 1               /* a cursor per lane: lane 0's */
#else
#define NCUR NSLOT           /* a cursor per slot */
#endif
byte cur[NR * NCUR];         /* the last id read (NONE: from the floor) */
byte floor[NR];              /* each relay process's own floor */
bit  fpv[NR];                /* BACKREAD: the pending floor candidate: */
byte fpl[NR];                /*   the last id handed out when it was taken, */
byte fpm[NR];                /*   the transactions begun by then (BACKREAD) */
bit  fcv[NR];                /* a confirmed floor candidate: a later statement raises to it */
byte fcu[NR];
#ifdef FRONTIER
byte hl[NR];                 /* the frontier step's last id, between its two reads */
#ifdef HOLDERS_FIRST
byte hh[NR * NSLOT];         /* its holders, in the variant that reads them first, */
byte hf[NR * NW];            /*   and their first ids */
#endif
byte H[NR * NSLOT];          /* the confirmed frontier of each slot */
bit  pv[NR * NSLOT];         /* a pending bound of the slot: */
byte pl[NR * NSLOT];         /*   the last id then, */
byte pm[NR * NSLOT];         /*   the slot's holders then */
#endif
byte win[NR * WMAX];         /* records in flight, in produce order */
byte wn[NR];
byte wkeys[NR];              /* keys in flight (bit k) */

/* Kafka */
byte kst[NID + 1];
bit  kfail[NR];              /* the relay's deliveries failed (a retriable error) */
bit  failed;                 /* Kafka fails once at most */
bit  acked[NID + 1];         /* acknowledged at least once */
bit  appended[NID + 1];      /* in the topic at least once (acknowledged or not) */
byte maxapp[NKEY];           /* the highest id of each key in the topic */

/* Temporaries of the d_steps: not part of the state. */
hidden byte i, j, s, x, f2, ret, stop, seen, cut, lastp, nm, all, passed, h0, h1;
hidden byte lp[NSLOT];

#define KEYC(k)   (65 + (k))
#define MAX(a, b) ((a) > (b) -> (a) : (b))

/* ---------------------------------------------------------------------------- writers */

#ifdef FRONTIER
#define TAKE_LOCK(t, k) \
    atomic { hold[SLOT(k)] = hold[SLOT(k)] | (1 << (t)); ts[t] = T_LOCKED; \
             printf("W%d takes the writer lock of slot %d\n", (t) + 1, SLOTNO(SLOT(k))) }
#endif
#define TAKE_ID(t, k) \
    atomic { last++; id = last; rkey[id] = k; rst[id] = R_OPEN; ts[t] = T_INS; \
             printf("W%d inserts key %c: id %d\n", (t) + 1, KEYC(k), id) }

#ifdef FRONTIER
/* The trigger's second lock, right after the transaction's first id; or none (a table
 * whose trigger shows no first id, a transaction begun before migration 0013). */
#define SHOW_FIRST(t) \
    if \
    :: atomic { fid[t] = id; printf("W%d shows its first id %d\n", (t) + 1, id) } \
    :: skip \
    fi
#endif

#ifdef FRONTIER
/* Visible first, then the locks go (PostgreSQL ends a transaction in the proc array before
 * it releases its locks). */
#define RELEASE(t, k) \
    atomic { hold[SLOT(k)] = hold[SLOT(k)] & ~(1 << (t)); fid[t] = 0; ts[t] = T_DONE; id = 0 }
#else
#define RELEASE(t, k)  ts[t] = T_DONE; id = 0
#endif

#define COMMIT(t, k) \
    atomic { rst[id] = R_COMM; printf("W%d commits id %d\n", (t) + 1, id) }; \
    RELEASE(t, k)
#define ROLLBACK(t, k) \
    atomic { rst[id] = R_ABORT; printf("W%d rolls back: id %d never exists\n", (t) + 1, id) }; \
    RELEASE(t, k)

/* W1 (key A) commits, rolls back, or stays open for good (a long transaction); W2 (key A)
 * is serialised after W1 by the application (it begins once W1 ended); W3 (key B) commits,
 * or prepares and commits the prepared transaction later (its rollback would be W1's to
 * every reader: the row never exists, and the lock goes when the transaction ends). */
proctype Writer(byte t; byte k)
{
    byte id;
    (t != 1 || ts[0] == T_DONE);
#ifdef BACKREAD
    atomic { ts[t] = T_BEGUN; printf("W%d begins\n", t + 1) }
    TAKE_ID(t, k);
#elif defined(ID_BEFORE_LOCK)
    TAKE_ID(t, k);
    TAKE_LOCK(t, k);
    SHOW_FIRST(t);
#else
    TAKE_LOCK(t, k);
    TAKE_ID(t, k);
    SHOW_FIRST(t);
#endif
    if
    :: t == 0 ->
        if
        :: COMMIT(t, k)
        :: ROLLBACK(t, k)
        :: atomic { w1stays = 1; printf("W1 stays open\n") }; end_open: false
        fi
    :: t == 1 -> COMMIT(t, k)
    :: t == 2 ->
        if
        :: COMMIT(t, k)
        :: atomic { rst[id] = R_PREP; ts[t] = T_PREP; printf("W3 prepares id %d\n", id) };
            if
            :: atomic { rst[id] = R_COMM; printf("W3: COMMIT PREPARED, id %d\n", id) };
               RELEASE(t, k)
            fi
        fi
    fi
}

/* U: an unrelated transaction that holds no writer lock, prepared from the start: it
 * finishes at any time, or never. */
proctype Unrelated()
{
    if
    :: atomic { tsu = T_DONE; printf("U finishes\n") }
    :: skip
    fi
}

/* ------------------------------------------------------------------------------ Kafka */

/* G2, as the consumers see the topic: never a lower id of a key after a higher one, except
 * a row that was in the topic already (a duplicate of a re-sent suffix). What the topic
 * holds is only kept for this property (it would only weigh in the others' state space). */
inline append(n)
{
#ifdef CHECK_ORDER
    assert(n >= maxapp[rkey[n]] || appended[n]);
    appended[n] = 1;
    maxapp[rkey[n]] = MAX(maxapp[rkey[n]], n)
#else
    skip
#endif
}

inline ack(n)
{
#ifdef CHECK_ORDER
    /* G2: first acknowledgements of a key in id order (for writers the application
     * serialises, id order is commit order). */
    if
    :: !acked[n] ->
        for (j : 1 .. NID) {
            if
            :: j < n && rkey[j] == rkey[n] -> assert(acked[j] || rst[j] == R_ABORT)
            :: else
            fi
        }
    :: else
    fi;
    acked[n] = 1;
#endif
    kst[n] = K_ACKED;
    append(n);
    printf("Kafka acknowledges %c@%d\n", KEYC(rkey[n]), n)
}

#define ACKABLE(r, p)  (wn[r] > (p) && kst[win[(r) * WMAX + (p)]] == K_FLIGHT && !kfail[r])
#ifdef CHECK_ORDER
#define MAYBE_APPENDED(r, p) \
    if \
    :: wn[r] > (p) && kst[win[(r) * WMAX + (p)]] == K_FLIGHT -> \
        if :: append(win[(r) * WMAX + (p)]) :: skip fi \
    :: else \
    fi
#else
#define MAYBE_APPENDED(r, p) skip
#endif

/* Acknowledges any record in flight (in any order: keys are on different partitions), or
 * fails one relay's deliveries, once: each record then without an outcome may or may not
 * be in the topic already. Outside the order property's runs only the front of a window
 * is acknowledged: a record acknowledged behind an unsettled front is purged with it on a
 * failure and is settled with it otherwise, so the relays go through the same states
 * either way (the topic's contents are kept for that property alone). */
proctype Kafka()
{
end:
    do
    :: d_step { ACKABLE(0, 0) -> ack(win[0]) }
    :: d_step { ACKABLE(1, 0) -> ack(win[WMAX]) }
#ifdef CHECK_ORDER
    :: d_step { ACKABLE(0, 1) -> ack(win[1]) }
    :: d_step { ACKABLE(1, 1) -> ack(win[WMAX + 1]) }
#endif
    :: atomic { !failed && (ACKABLE(0, 0) || ACKABLE(0, 1)) ->
            failed = 1; kfail[0] = 1; printf("Kafka fails R1's deliveries\n");
            MAYBE_APPENDED(0, 0); MAYBE_APPENDED(0, 1) }
    :: atomic { !failed && (ACKABLE(1, 0) || ACKABLE(1, 1)) ->
            failed = 1; kfail[1] = 1; printf("Kafka fails R2's deliveries\n");
            MAYBE_APPENDED(1, 0); MAYBE_APPENDED(1, 1) }
    od
}

/* ----------------------------------------------------------------------------- relays */

inline produce(r, n)
{
    printf("R%d produces %c@%d\n", r + 1, KEYC(rkey[n]), n);
#ifdef CHECK_ORDER
    /* G2: no lower id of the key is still uncommitted (open or prepared), nor committed
     * and not acknowledged. */
    for (j : 1 .. NID) {
        if
        :: j < n && rkey[j] == rkey[n] && (rst[j] == R_OPEN || rst[j] == R_PREP) ->
            printf("G2 violated: %c@%d produced while %c@%d may still commit\n",
                   KEYC(rkey[n]), n, KEYC(rkey[j]), j);
            assert(false)
        :: j < n && rkey[j] == rkey[n] && rst[j] == R_COMM && !acked[j] ->
            printf("G2 violated: %c@%d produced while %c@%d is committed and not acknowledged\n",
                   KEYC(rkey[n]), n, KEYC(rkey[j]), j);
            assert(false)
        :: else
        fi
    }
#endif
    win[r * WMAX + wn[r]] = n;
    wn[r]++;
    wkeys[r] = wkeys[r] | (1 << rkey[n]);
    kst[n] = K_FLIGHT
}

#define IN_FLIGHT_OR_SEEN(r, n)  (((wkeys[r] | seen) >> rkey[n]) & 1)
#define READS_LANE0(r)           (held[r] & ~rel[r] & LANE0)

#ifdef BACKREAD
/* One read of lane 0 (`_fill`; lane 1 has no row): committed rows of its slots after its
 * cursor (from the floor when it has none), in id order, LIMIT rows; the prefix before a
 * key in flight is produced, and the cursor becomes the last id produced. With nothing in
 * flight the cursor is cleared first: the back-read from the floor. */
inline fill(r)
{
    if
    :: READS_LANE0(r) ->
        if :: wn[r] == 0 -> cur[r] = NONE :: else fi;
        if :: cur[r] == NONE -> cur[r] = floor[r] - 1 :: else fi;
        ret = 0; stop = 0; seen = 0; lastp = 0;
        for (i : 1 .. NID) {
            if
            :: rst[i] == R_COMM && i > cur[r] && ret < LIMIT ->
                ret++;
                if
                :: !stop && !IN_FLIGHT_OR_SEEN(r, i) ->
                    produce(r, i); seen = seen | (1 << rkey[i]); lastp = i
                :: else -> stop = 1
                fi
            :: else
            fi
        }
        if
        :: lastp > 0 -> printf("R%d: lane 0 read after id %d, cursor %d\n", r + 1, cur[r], lastp); cur[r] = lastp
        :: else
        fi
    :: else
    fi
}

/* `floor.sql`, one step: raise to a confirmed candidate (the first row still there at or
 * below it, or past it); check the pending one against pg_stat_activity (no session in a
 * transaction begun by then that runs a statement or holds an xid; without
 * pg_read_all_stats the writers' sessions are not seen at all) and pg_prepared_xacts;
 * take the next one (the last id, then the time: the transactions begun by then). */
inline floor_step(r)
{
    f2 = floor[r];
    if
    :: fcv[r] ->
        f2 = fcu[r] + 1;
        for (i : 1 .. NID) {
            if :: i >= floor[r] && i <= fcu[r] && rst[i] == R_COMM && i < f2 -> f2 = i :: else fi
        }
    :: else
    fi;
    passed = 0;
    if
    :: fpv[r] ->
        passed = (tsu != T_PREP);
        for (i : 0 .. NW - 1) {
            if
            :: ts[i] == T_PREP -> passed = 0
#ifndef NOSTATS
            :: ((fpm[r] >> i) & 1) && ts[i] == T_INS -> passed = 0
#endif
            :: else
            fi
        }
    :: else
    fi;
    nm = 0;
    for (i : 0 .. NW - 1) {
        if :: ts[i] == T_BEGUN || ts[i] == T_INS -> nm = nm | (1 << i) :: else fi
    }
    if
    :: f2 > floor[r] -> floor[r] = f2; printf("R%d: floor %d\n", r + 1, f2)
    :: else
    fi;
    if
    :: passed && fpl[r] >= floor[r] ->
        printf("R%d: floor candidate %d confirmed (no writing transaction seen)\n", r + 1, fpl[r])
    :: else
    fi;
    fcv[r] = passed;
    fcu[r] = (passed -> fpl[r] : 0);
    if
    :: passed || !fpv[r] -> fpv[r] = 1; fpl[r] = last; fpm[r] = nm
    :: else
    fi
}
#endif /* BACKREAD */

#ifdef FRONTIER
#ifdef HOLDERS_FIRST
#define HOLDERS(r, s) hh[(r) * NSLOT + (s)]
#define FIRST(r, t)   hf[(r) * NW + (t)]
#else
#define HOLDERS(r, s) hold[s]
#define FIRST(r, t)   fid[t]
#endif

/* The frontier step's second part (`rules.advance_frontier`), per slot: a pending bound
 * whose holders are all gone becomes the frontier; the slot's bound is L, or below the
 * lowest first id its holders show; it is the frontier at once if every holder shows one,
 * else (unless a bound is pending) it becomes the pending bound, with the holders that show
 * none. The floor's candidate is the lowest frontier, raised to by a later statement. */
inline frontier(r)
{
    h0 = H[r * NSLOT]; h1 = H[r * NSLOT + 1];
    for (s : 0 .. NSLOT - 1) {
        x = r * NSLOT + s;
        if
        :: pv[x] && (pm[x] & HOLDERS(r, s)) == 0 -> H[x] = MAX(H[x], pl[x]); pv[x] = 0; pl[x] = 0; pm[x] = 0
        :: else
        fi;
        lastp = hl[r]; nm = 0;
        for (j : 0 .. NW - 1) {
            if
            :: ((HOLDERS(r, s) >> j) & 1) && FIRST(r, j) != 0 ->
                if :: FIRST(r, j) - 1 < lastp -> lastp = FIRST(r, j) - 1 :: else fi
            :: ((HOLDERS(r, s) >> j) & 1) && FIRST(r, j) == 0 -> nm = nm | (1 << j)
            :: else
            fi
        }
#ifdef NO_FIRST_WAIT
        nm = 0;
#endif
        if
        :: nm == 0 -> H[x] = MAX(H[x], lastp)
        :: nm != 0 && !pv[x] -> pv[x] = 1; pl[x] = lastp; pm[x] = nm
        :: else
        fi;
        if :: pv[x] && pl[x] <= H[x] -> pv[x] = 0; pl[x] = 0; pm[x] = 0 :: else fi
    }
    fcv[r] = 1; fcu[r] = (H[r * NSLOT] < H[r * NSLOT + 1] -> H[r * NSLOT] : H[r * NSLOT + 1]);
    hl[r] = 0;
    if
    :: h0 != H[r * NSLOT] || h1 != H[r * NSLOT + 1] ->
        printf("R%d: frontier of slot 0 %d, of slot 2 %d\n", r + 1, H[r * NSLOT], H[r * NSLOT + 1])
    :: else
    fi
}

/* One read (a new snapshot): committed rows of the readable slots with cursor < id <= H,
 * in id order, LIMIT rows; the prefix before a key in flight is produced. A slot's cursor
 * becomes the last id produced in it, and its frontier if nothing of the slot was cut and
 * the read was not cut by its LIMIT. With nothing in flight the cursors are cleared first:
 * the back-read from the floor, as the back-read protocol. */
inline fill(r)
{
    if
    :: READS_LANE0(r) ->
        for (s : 0 .. NSLOT - 1) {
            x = r * NSLOT + s;
            if :: wn[r] == 0 -> cur[x] = NONE :: else fi;
            if :: cur[x] == NONE -> cur[x] = floor[r] - 1 :: else fi;
            lp[s] = 0
        }
        ret = 0; stop = 0; seen = 0; cut = 0;
        for (i : 1 .. NID) {
            s = SLOT(rkey[i]);
            x = r * NSLOT + s;
            if
            :: rst[i] == R_COMM && i > cur[x] && i <= H[x] && ret < LIMIT ->
                ret++;
                if
                :: !stop && !IN_FLIGHT_OR_SEEN(r, i) ->
                    produce(r, i); seen = seen | (1 << rkey[i]); lp[s] = i
                :: else -> stop = 1; cut = cut | (1 << s)
                fi
            :: else
            fi
        }
        for (s : 0 .. NSLOT - 1) {
            x = r * NSLOT + s;
            if :: lp[s] > 0 -> cur[x] = lp[s] :: else fi;
#ifdef NAIVE_LIMIT
            if :: !((cut >> s) & 1) && H[x] > cur[x] -> cur[x] = H[x] :: else fi
#else
            if :: ret < LIMIT && !((cut >> s) & 1) && H[x] > cur[x] -> cur[x] = H[x] :: else fi
#endif
        }
        if
        :: ret > 0 -> printf("R%d: cursor of slot 0 %d, of slot 2 %d\n", r + 1, cur[r * NSLOT], cur[r * NSLOT + 1])
        :: else
        fi
    :: else
    fi
}

/* The floor's raise, by a later statement than the one that confirmed its candidate. */
inline floor_step(r)
{
    if
    :: fcv[r] ->
        f2 = fcu[r] + 1;
        for (i : 1 .. NID) {
            if :: i >= floor[r] && i <= fcu[r] && rst[i] == R_COMM && i < f2 -> f2 = i :: else fi
        }
        fcv[r] = 0; fcu[r] = 0;
        if
        :: f2 > floor[r] -> floor[r] = f2; printf("R%d: floor %d\n", r + 1, f2)
        :: else
        fi
    :: else
    fi
}
#endif /* FRONTIER */

/* The window's front settled (`rules.settle`): acknowledged rows deleted; a failed record
 * stops the flow: every record left is purged (to go out again from the outbox) and the
 * cursors are cleared. */
inline settle(r)
{
    do
    :: wn[r] > 0 && kst[win[r * WMAX]] == K_ACKED ->
        i = win[r * WMAX];
        rst[i] = R_GONE; kst[i] = K_NONE;
        wkeys[r] = wkeys[r] & ~(1 << rkey[i]);
        win[r * WMAX] = win[r * WMAX + 1]; win[r * WMAX + 1] = 0;
        wn[r]--;
        printf("R%d deletes id %d\n", r + 1, i)
    :: else -> break
    od;
    if
    :: wn[r] > 0 && kfail[r] ->
        for (i : 0 .. WMAX - 1) {
            if :: i < wn[r] -> kst[win[r * WMAX + i]] = K_NONE; win[r * WMAX + i] = 0 :: else fi
        }
        printf("R%d: delivery failed, %d records purged, cursors cleared\n", r + 1, wn[r]);
        wn[r] = 0; wkeys[r] = 0; kfail[r] = 0;
        for (s : 0 .. NCUR - 1) { cur[r * NCUR + s] = NONE }
    :: else
    fi
}

/* Lane 0, marked for hand-over, goes back once nothing of it is in flight (every record of
 * the model is lane 0's); its cursors go with it. */
inline release(r)
{
    if
    :: (rel[r] & LANE0) && wn[r] == 0 ->
        held[r] = held[r] & ~LANE0; rel[r] = 0;
        for (s : 0 .. NCUR - 1) { cur[r * NCUR + s] = NONE }
        printf("R%d gives lane 0 back\n", r + 1)
    :: else
    fi
}

/* The state of a relay that will not read again (R1 once it marked lane 0 for hand-over:
 * it only waits for its records in flight, then stops), cleared: it would only weigh in
 * the state space. */
inline forget(r)
{
    floor[r] = 0; fpv[r] = 0; fpl[r] = 0; fpm[r] = 0; fcv[r] = 0; fcu[r] = 0;
    for (s : 0 .. NCUR - 1) { cur[r * NCUR + s] = 0 }
#ifdef FRONTIER
    for (s : 0 .. NSLOT - 1) {
        x = r * NSLOT + s;
        H[x] = 0; pv[x] = 0; pl[x] = 0; pm[x] = 0
    }
#endif
}

/* The end of a round: settle the window's front (delete, or the failure path), give back
 * an idle lane, the floor statement, and the next look at the lanes: R1 marks lane 0 for
 * hand-over once the plan moved it. */
inline round_end(r)
{
    settle(r);
    release(r);
    floor_step(r);
    /* Nothing in flight: the next read clears the cursors anyway (the back-read from the
     * floor); cleared now, states that differ only in them are one. */
    if :: wn[r] == 0 -> for (s : 0 .. NCUR - 1) { cur[r * NCUR + s] = NONE } :: else fi;
    if
    :: r == 0 && handreq && !rel[0] && (held[0] & LANE0) ->
        rel[0] = LANE0; forget(r); printf("R1 marks lane 0 for hand-over\n")
    :: else
    fi
}

/* One round after the other (`OutboxRelay._round`), for ever. R1 holds lane 0 from the
 * start; once it marked it for hand-over it only settles its records in flight, gives the
 * lane back and stops (holding no lane, it reads, deletes and changes nothing). R2 starts
 * when the plan gives it lane 0 (a newcomer: floor 1, no frontier, no cursor) and takes it
 * once R1 let it go. A round's statements:
 * BACKREAD: the read, then the round's end; FRONTIER: the frontier step's second read, the
 * read, then the round's end together with the next round's first read (of the frontier
 * statement). The round's end (settle and delete, give back an idle lane, the floor
 * statement, the next look at the lanes) is one step: the writers' steps commute with its
 * deletes and its lane locks, and the floor's raise looks only at ids below a confirmed
 * candidate, which no writer step changes (unless the floor is wrong, which the floor
 * property catches), so a writer step between its parts and the next first read is one
 * before or after them all. */
#ifdef HOLDERS_FIRST
#define FIRST_READ(r)  for (s : 0 .. NSLOT - 1) { hh[r * NSLOT + s] = hold[s] }; \
                       for (s : 0 .. NW - 1) { hf[r * NW + s] = fid[s] }
#define SECOND_READ(r) hl[r] = last; frontier(r); for (s : 0 .. NSLOT - 1) { hh[r * NSLOT + s] = 0 }; \
                       for (s : 0 .. NW - 1) { hf[r * NW + s] = 0 }
#else
#define FIRST_READ(r)  hl[r] = last
#define SECOND_READ(r) frontier(r)
#endif

proctype Relay(byte r)
{
    if
    :: r == 1 -> atomic { handreq && !(held[0] & LANE0) -> held[1] = LANE0; printf("R2 takes lane 0\n") }
    :: else
    fi;
#ifdef FRONTIER
    d_step { FIRST_READ(r) }
#endif
end:
    do
    :: r == 0 && !(held[0] & LANE0) -> break
    :: r == 0 && rel[0] -> d_step { settle(r); release(r) }
    :: else ->
#ifdef FRONTIER
       d_step { SECOND_READ(r) }
       d_step { fill(r) }
       d_step { round_end(r); if :: !rel[r] -> FIRST_READ(r) :: else fi }
#else
       d_step { fill(r) }
       d_step { round_end(r) }
#endif
    od;
    printf("R%d stops (it holds no lane)\n", r + 1)
}

/* R2 starts, at any time or never: the lanes' plan (`rules.plan_lanes`) gives it lane 0,
 * which R1 gives back at its next look once nothing of it is in flight. */
proctype Plan()
{
    if
    :: atomic { handreq = 1; printf("R2 starts: the plan moves lane 0 from R1 to R2\n") }
    :: skip
    fi
}

/* ------------------------------------------------------------------------- properties */

#define BELOW(r, n)  ((n) < floor[r] && rst[n] >= R_OPEN && rst[n] <= R_COMM)
#define FLOOR_BAD(r) (BELOW(r, 1) || BELOW(r, 2) || BELOW(r, 3))

#ifdef CHECK_FLOOR
/* Floor safety: no floor above a row that is committed and unpublished, or may still
 * commit. */
active proctype FloorSafety()
{
    atomic {
        (FLOOR_BAD(0) || FLOOR_BAD(1)) ->
        printf("floor safety violated: a floor passed a row that may still commit or is unpublished\n");
        assert(false)
    }
}
#endif

/* G1, no row stuck: from some point on no committed row is left in the outbox (each row
 * commits at most once, so: every committed row is acknowledged and deleted while the
 * relays run). Checked under weak fairness (pan -a -f); the formula also states two of its
 * consequences as premises, which only prune the search (every weakly fair run has them):
 * each writer ends (or W1 stays open on purpose, and W2 then never begins), and Kafka
 * answers (infinitely often no record waits for its outcome). */
#define nocommitted  (rst[1] != R_COMM && rst[2] != R_COMM && rst[3] != R_COMM)
#define writers_done (ts[2] == T_DONE && (w1stays || (ts[0] == T_DONE && ts[1] == T_DONE)))
#define kafka_idle   (kst[1] != K_FLIGHT && kst[2] != K_FLIGHT && kst[3] != K_FLIGHT)
ltl g1 { (<> writers_done && []<> kafka_idle) -> <>[] nocommitted }

init
{
    atomic {
        floor[0] = 1; floor[1] = 1;
        for (i : 0 .. NR * NCUR - 1) { cur[i] = NONE }
        held[0] = LANE0;
        tsu = T_PREP;
        run Writer(0, KA);
        run Writer(1, KA);
        run Writer(2, KB);
        run Unrelated();
        run Plan();
        run Relay(0);
        run Relay(1);
        run Kafka()
    }
}
