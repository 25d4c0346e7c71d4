/* test_cacheq.c: the entry cache core (csrc/plim_cacheq.c) without Python.
 * Randomised operations on an index and a queue against brute-force
 * models, then the walks' rule on small cases.  Prints "N passed, M failed". */
#include "plim_cacheq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define CHECK(c) do { if (c) passed++; else { failed++; \
    fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); } } while (0)

#define N 3000
static plim_cq_entry_t ents[N];
static int in_cache[N];   /* model: entry i cached */

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static int64_t spacing = 7;

static void pos_of(int i, int64_t *l, int64_t *e) {
    *l = i % 3;                       /* three ledgers */
    *e = (int64_t)(i / 3) * spacing;  /* 7: sparse ids (packed pages); 1: dense (direct) */
}

struct range_acc { int64_t last_l, last_e; int n; int ordered; };

static void on_range(plim_cq_entry_t *e, void *arg) {
    struct range_acc *a = arg;
    if (a->n && !(a->last_l < e->ledger || (a->last_l == e->ledger && a->last_e < e->entry)))
        a->ordered = 0;
    a->last_l = e->ledger;
    a->last_e = e->entry;
    a->n++;
}

static void test_index_against_model(void) {
    plim_cq_index_t ix;
    plim_cq_t q;
    plim_cq_index_init(&ix);
    plim_cq_init(&q, 0, 0);
    for (int round = 0; round < 40000; round++) {
        int i = (int)(next_rand() % N);
        int64_t l, e;
        pos_of(i, &l, &e);
        switch (next_rand() % 4) {
        case 0:
        case 1:
            if (!in_cache[i]) {
                plim_cq_entry_init(&ents[i], (int64_t)(i % 50), 0, 0);
                CHECK(plim_cq_index_put(&ix, &ents[i], l, e) == 0);
                plim_cq_push(&q, &ents[i]);
                in_cache[i] = 1;
            } else {
                plim_cq_entry_t other;
                plim_cq_entry_init(&other, 1, 0, 0);
                CHECK(plim_cq_index_put(&ix, &other, l, e) == 1);
            }
            break;
        case 2:
            CHECK((plim_cq_index_get(&ix, l, e) != NULL) == in_cache[i]);
            break;
        default:
            if (next_rand() % 50 == 0) {
                /* drop everything up to a random position */
                plim_cq_gone_t g;
                plim_cq_gone_init(&g);
                int64_t dl = (int64_t)(next_rand() % 3), de = (int64_t)(next_rand() % 7000) - 1;
                plim_cq_index_drop_upto(&ix, &q, dl, de, &g);
                int64_t n = 0;
                for (int k = 0; k < N; k++) {
                    int64_t kl, ke;
                    pos_of(k, &kl, &ke);
                    if (in_cache[k] && (kl < dl || (kl == dl && ke <= de))) {
                        in_cache[k] = 0;
                        n++;
                        CHECK(ents[k].flags & PLIM_CQ_REMOVED);
                        CHECK(ents[k].owner == NULL);
                    }
                }
                CHECK(g.entries == n);
                for (plim_cq_entry_t *x = g.first; x; x = x->next)
                    x->flags &= ~PLIM_CQ_REMOVED;   /* reusable in this test */
            } else if (in_cache[i]) {
                plim_cq_index_remove(&ents[i]);
                plim_cq_unlink(&q, &ents[i]);
                in_cache[i] = 0;
            }
        }
    }
    int64_t n = 0, b = 0;
    for (int k = 0; k < N; k++)
        if (in_cache[k]) {
            n++;
            b += ents[k].size;
        }
    CHECK(ix.entries == n && ix.bytes == b && q.entries == n && q.bytes == b);
    struct range_acc a = {0, 0, 0, 1};
    plim_cq_index_range(&ix, -5, -5, 9, INT64_MAX, on_range, &a);
    CHECK(a.n == n && a.ordered);
    struct range_acc one = {0, 0, 0, 1};
    plim_cq_index_range(&ix, 1, 70, 1, 70, on_range, &one);
    CHECK(one.n == (plim_cq_index_get(&ix, 1, 70) != NULL));
    /* empty the index so it can be freed */
    plim_cq_gone_t g;
    plim_cq_gone_init(&g);
    plim_cq_index_drop_upto(&ix, &q, INT64_MAX, INT64_MAX, &g);
    CHECK(g.entries == n && ix.entries == 0 && q.entries == 0 && q.head == NULL);
    plim_cq_index_free(&ix);
}

static void test_walk_rule(void) {
    /* Pulsar's size case: 40 (accessed), 50 (3 reads), 30; free 35 with
     * (5, on) removes 40 and 30 and keeps the one with reads. */
    plim_cq_t q;
    plim_cq_entry_t e[3];
    plim_cq_gone_t g;
    int need_now;
    plim_cq_init(&q, 5, 1);
    plim_cq_entry_init(&e[0], 40, 0, 0);
    plim_cq_entry_init(&e[1], 50, 0, 3);
    plim_cq_entry_init(&e[2], 30, 0, 0);
    e[0].flags |= PLIM_CQ_ACCESSED;
    for (int i = 0; i < 3; i++)
        plim_cq_push(&q, &e[i]);
    plim_cq_gone_init(&g);
    plim_cq_evict_size(&q, 35, NULL, &g, &need_now);
    CHECK(need_now == 1 && g.entries == 0);        /* the first requeue needs a clock */
    int64_t now = 77;
    plim_cq_evict_size(&q, 35, &now, &g, &need_now);
    CHECK(need_now == 0 && g.entries == 2 && g.bytes == 70);
    CHECK(q.head == &e[1] && q.tail == &e[1] && q.entries == 1 && q.requeues == 2);
    CHECK(e[1].timestamp_ns == 77 && e[1].requeue_count == 1);
    /* time walk: stops at the first entry not older */
    plim_cq_gone_init(&g);
    now = 100;
    plim_cq_evict_before(&q, 77, &now, &g, &need_now);
    CHECK(g.entries == 0 && q.entries == 1);
    e[1].expected_reads = 0;
    plim_cq_evict_before(&q, 78, NULL, &g, &need_now);
    CHECK(g.entries == 1 && q.entries == 0 && q.head == NULL && !need_now);
    /* the size walk ends even when everything wants a requeue */
    plim_cq_init(&q, 3, 1);
    for (int i = 0; i < 3; i++) {
        plim_cq_entry_init(&e[i], 10, 0, 9);
        e[i].flags |= PLIM_CQ_ACCESSED;
        plim_cq_push(&q, &e[i]);
    }
    plim_cq_gone_init(&g);
    now = 5;
    plim_cq_evict_size(&q, 1000, &now, &g, &need_now);
    CHECK(g.entries == 3 && q.entries == 0 && q.requeues == 9);
    int64_t ne, nb;
    plim_cq_non_evictable(&q, &ne, &nb);
    CHECK(ne == 0 && nb == 0);
}

/* INT64_MIN is a time like any other: a walk given it requeues with it and
 * ends (it once meant "no reading yet" and the walk asked for one for ever). */
static void test_any_int64_is_a_time(void) {
    plim_cq_t q;
    plim_cq_entry_t e[2];
    plim_cq_gone_t g;
    int need_now = 0;
    plim_cq_init(&q, 1, 1);
    plim_cq_entry_init(&e[0], 10, INT64_MIN, 3);
    plim_cq_entry_init(&e[1], 10, INT64_MIN, 0);
    plim_cq_push(&q, &e[0]);
    plim_cq_push(&q, &e[1]);
    plim_cq_gone_init(&g);
    int64_t now = INT64_MIN;
    int calls = 0;
    do {
        plim_cq_evict_before(&q, INT64_MIN + 1, need_now ? &now : NULL, &g, &need_now);
    } while (need_now && ++calls < 10);
    /* e[0] is requeued once (to INT64_MIN, still old), e[1] goes, then
     * e[0] has used its one requeue and goes too */
    CHECK(calls == 1 && !need_now);
    CHECK(g.entries == 2 && g.first == &e[1] && g.last == &e[0]);
    CHECK(q.entries == 0 && q.requeues == 1 && e[0].requeue_count == 1);
    CHECK(e[0].timestamp_ns == INT64_MIN && (e[0].flags & PLIM_CQ_INIT));
}

/* Byte totals: a queue refuses (plim_cq_fits) what would pass INT64_MAX, an
 * index refuses it (-2), and the walk's totals saturate. */
static void test_byte_totals_stay_in_range(void) {
    plim_cq_t q;
    plim_cq_index_t ix;
    plim_cq_entry_t a, b, c;
    plim_cq_gone_t g;
    int need_now;
    plim_cq_init(&q, 0, 0);
    plim_cq_index_init(&ix);
    plim_cq_entry_init(&a, INT64_MAX - 5, 0, 0);
    plim_cq_entry_init(&b, 6, 0, 0);
    plim_cq_entry_init(&c, 5, 0, 0);
    CHECK(plim_cq_fits(&q, &a));
    CHECK(plim_cq_index_put(&ix, &a, 1, 1) == 0);
    plim_cq_push(&q, &a);
    CHECK(!plim_cq_fits(&q, &b) && plim_cq_fits(&q, &c));
    CHECK(plim_cq_index_put(&ix, &b, 1, 2) == -2 && b.owner == NULL && ix.entries == 1);
    CHECK(plim_cq_index_put(&ix, &c, 1, 3) == 0);
    plim_cq_push(&q, &c);
    CHECK(q.bytes == INT64_MAX && ix.bytes == INT64_MAX);
    q.evicted_bytes = UINT64_MAX - 3;
    plim_cq_gone_init(&g);
    g.bytes = 10;   /* as if an earlier part of the walk had taken 10 bytes */
    plim_cq_evict_size(&q, INT64_MAX, NULL, &g, &need_now);
    /* the first entry takes the total to the (saturated) target: done */
    CHECK(g.entries == 1 && g.bytes == INT64_MAX && q.evicted_bytes == UINT64_MAX);
    CHECK(q.entries == 1 && q.bytes == 5 && ix.entries == 1 && ix.bytes == 5);
    plim_cq_gone_init(&g);
    plim_cq_evict_size(&q, 1, NULL, &g, &need_now);
    CHECK(g.entries == 1 && g.bytes == 5 && q.evicted_bytes == UINT64_MAX);
    CHECK(q.entries == 0 && q.bytes == 0 && ix.entries == 0 && ix.bytes == 0 && ix.npages == 0);
    plim_cq_index_free(&ix);
}

/* Sparse and dense pages: lookups, order and removal with entries spread
 * one per page, packed in one page, and a page drained until it shrinks. */
static void test_pages(void) {
    static plim_cq_entry_t ents2[200];
    plim_cq_index_t ix;
    plim_cq_t q;
    plim_cq_index_init(&ix);
    plim_cq_init(&q, 0, 0);
    /* ids 0..63 of ledger 2 (one full page), then 136 ids 64 apart (one page
     * each), inserted in a scrambled order */
    for (int k = 0; k < 200; k++) {
        int i = (k * 37) % 200;
        int64_t id = i < 64 ? i : 64 + (int64_t)(i - 64) * 64;
        plim_cq_entry_init(&ents2[i], i, 0, 0);
        CHECK(plim_cq_index_put(&ix, &ents2[i], 2, id) == 0);
        plim_cq_push(&q, &ents2[i]);
    }
    CHECK(ix.entries == 200 && ix.npages == 1 + 136);
    for (int i = 0; i < 200; i++) {
        int64_t id = i < 64 ? i : 64 + (int64_t)(i - 64) * 64;
        CHECK(plim_cq_index_get(&ix, 2, id) == &ents2[i]);
        CHECK(plim_cq_index_get(&ix, 2, id + 1) == (i < 64 ? &ents2[i + 1] : NULL));
    }
    struct range_acc a = {0, 0, 0, 1};
    plim_cq_index_range(&ix, 2, 10, 2, 64 * 5, on_range, &a);
    CHECK(a.ordered && a.n == (63 - 10 + 1) + 5);   /* ids 10..63, 64, 128, ..., 320 */
    /* drain the full page from the top down: it shrinks, lookups still work */
    for (int i = 63; i >= 1; i--) {
        plim_cq_index_remove(&ents2[i]);
        plim_cq_unlink(&q, &ents2[i]);
        CHECK(plim_cq_index_get(&ix, 2, 0) == &ents2[0]);
        CHECK(plim_cq_index_get(&ix, 2, i) == NULL);
    }
    CHECK(ix.npages == 1 + 136);
    /* drop up to the middle of the sparse run */
    plim_cq_gone_t g;
    plim_cq_gone_init(&g);
    plim_cq_index_drop_upto(&ix, &q, 2, 64 * 50, &g);
    CHECK(g.entries == 1 + 50 && ix.entries == 200 - 63 - 51);
    CHECK(plim_cq_index_get(&ix, 2, 64 * 51) == &ents2[64 + 50]);
    plim_cq_gone_init(&g);
    plim_cq_index_drop_upto(&ix, &q, INT64_MAX, INT64_MAX, &g);
    CHECK(ix.entries == 0 && ix.npages == 0 && q.entries == 0);
    plim_cq_index_free(&ix);
}

int main(void) {
    test_index_against_model();
    /* again with consecutive ids: pages fill up to the direct layout and
     * fall back to packed as they drain */
    spacing = 1;
    memset(in_cache, 0, sizeof(in_cache));
    test_index_against_model();
    test_walk_rule();
    test_any_int64_is_a_time();
    test_byte_totals_stay_in_range();
    test_pages();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
