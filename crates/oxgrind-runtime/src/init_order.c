/* Our constructor before every other object's but our own dependencies'.
 *
 * The dynamic loader initialises objects in the order of the main map's `l_initfini` array,
 * last entry first: dependencies before the objects that need them. A preloaded object that
 * nothing depends on sits near the front of that array (it is loaded right after the
 * executable), so its constructor runs after every library's: a library whose constructors
 * allocate (rustc's libLLVM: cl::opt registrations, std::map nodes, through its own
 * operator new) does so before the engine has taken over, and those blocks, and the errors
 * made on them, are never seen. Valgrind sees them because it starts before the loader and
 * runs the loader itself under translation; DynamoRIO's early injection likewise maps the
 * program and its interpreter itself and starts at the interpreter's first instruction. We
 * start inside the program, so we move ourselves instead: the first code of ours the loader
 * runs is not a constructor but an IFUNC resolver, called while it relocates this object
 * (with -z now, at load time). The loader relocates objects in the same array's order, last
 * first, so when we are relocated every object after us in the array is already relocated
 * and none has been initialised (not even libc: no libc call, no TLS, no PLT call here;
 * the file is built so that no loop becomes a call to memset or memcpy, and without the
 * stack protector, whose canary is in TLS).
 *
 * The resolver rewrites the array's part from our entry to its end (all already relocated,
 * so the relocation loop, which goes on downwards from our entry, visits nothing twice):
 * first the objects that are not in the closure of our dependencies, in their order, then
 * us, then our dependencies' closure (libc, libgcc_s, ld.so), in their order. Initialisation
 * then runs our dependencies, us, and everything else; each object still comes after its
 * own dependencies (the closure is closed under dependencies and both parts keep their
 * relative order). Finalisation is unaffected: `_dl_fini` sorts the objects afresh.
 *
 * `l_initfini` is a private field of `struct link_map`, so it is found, not assumed: the
 * loader allocates the main map's array as n entries, a NULL, then the n entries of its
 * search list (`l_searchlist.r_list`, followed by its count `r_nlist`), so the main map holds
 * two words F and R with R == F + (n + 1) * 8 and n right after R. Only a pair with that
 * shape is dereferenced, and it is used only if F[0] is the main map, F[n] is NULL, both
 * arrays hold the same objects of the loader's list, and our own entry's list at the same
 * offset starts with us (each object's l_initfini is itself and its direct dependencies). Anything else (another loader, a layout that
 * changed): nothing is touched, and our constructor runs where it always did. */
#include <elf.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>

/* The loader's debugger interface: r_map is the main map (exported by ld.so). */
extern struct r_debug _r_debug;
/* This object's dynamic section: how its link map is recognised (l_ld). */
extern ElfW(Dyn) _DYNAMIC[] __attribute__((visibility("hidden")));

/* What the resolver did, for the runtime to report (init_order.rs). */
enum {
    ORDER_NOT_RUN = 0,
    /* Our constructor now runs right after our dependencies'. */
    ORDER_MOVED = 1,
    /* We are not in the main map's list (loaded by dlopen): nothing to move. */
    ORDER_NOT_PRELOADED = 2,
    /* The loader's structures did not have the shape described above: untouched. */
    ORDER_UNRECOGNISED = 3,
    /* Already first among the objects that do not depend on us. */
    ORDER_ALREADY_FIRST = 4,
};
static int order_result = ORDER_NOT_RUN;

/* More objects than this: leave the order alone (the work arrays live on the stack). */
#define MAX_OBJECTS 1024
/* How far into the main map's struct link_map the two fields are looked for (glibc 2.36:
 * l_initfini at about 0x3f0, the whole struct about 0x470 bytes). */
#define SCAN_WORDS 256

/* The index of `map` in `list[0..n)`, or -1. */
static long index_of(struct link_map **list, long n, struct link_map *map) {
    for (long i = 0; i < n; i++)
        if (list[i] == map)
            return i;
    return -1;
}

/* Whether `map` is one of the loader's objects (on the list that starts at `main_map`). */
static int is_object(struct link_map *main_map, struct link_map *map) {
    long steps = 0;
    for (struct link_map *l = main_map; l != NULL && steps <= MAX_OBJECTS; l = l->l_next, steps++)
        if (l == map)
            return 1;
    return 0;
}

/* Finds the main map's l_initfini (returned, its length in *count, the field's offset in the
 * struct in *field) or NULL when no pair of words has the loader's shape. Both arrays must
 * hold the same n objects of the loader's list: the address arithmetic alone also matches
 * r_list and whatever the loader's bump allocator placed right after the pair's block. */
static struct link_map **find_initfini(struct link_map *main_map, long objects, long *count,
                                       long *field) {
    const uint64_t *words = (const uint64_t *)main_map;
    for (long f = 0; f < SCAN_WORDS; f++) {
        uint64_t first = words[f];
        if (first == 0 || (first & 7) != 0)
            continue;
        for (long r = 0; r + 1 < SCAN_WORDS; r++) {
            uint64_t n = (uint32_t)words[r + 1];
            if (r == f || n < 2 || (long)n > objects || n > MAX_OBJECTS)
                continue;
            if (words[r] != first + (n + 1) * sizeof(void *))
                continue;
            struct link_map **list = (struct link_map **)first;
            struct link_map **search = (struct link_map **)words[r];
            if (list[0] != main_map || list[n] != NULL || search[0] != main_map)
                continue;
            int same = 1;
            for (uint64_t i = 0; same && i < n; i++)
                same = is_object(main_map, list[i]) && is_object(main_map, search[i]) &&
                       index_of(search, (long)n, list[i]) >= 0;
            if (!same)
                continue;
            *count = (long)n;
            *field = f;
            return list;
        }
    }
    return NULL;
}

static void move_ourselves_first(void) {
    struct link_map *main_map = _r_debug.r_map;
    if (main_map == NULL) {
        order_result = ORDER_UNRECOGNISED;
        return;
    }
    long objects = 0;
    for (struct link_map *l = main_map; l != NULL && objects <= MAX_OBJECTS; l = l->l_next)
        objects++;
    long n = 0, field = 0;
    struct link_map **initfini = find_initfini(main_map, objects, &n, &field);
    if (initfini == NULL) {
        order_result = ORDER_UNRECOGNISED;
        return;
    }
    long ours = -1;
    for (long i = 0; i < n; i++)
        if (initfini[i]->l_ld == _DYNAMIC)
            ours = i;
    if (ours < 0) {
        order_result = ORDER_NOT_PRELOADED;
        return;
    }
    /* We depend on libc: our own list at that field must exist and start with us, or the
     * field is not l_initfini. */
    struct link_map **own = ((struct link_map ***)initfini[ours])[field];
    if (own == NULL || own[0] != initfini[ours] || own[1] == NULL) {
        order_result = ORDER_UNRECOGNISED;
        return;
    }
    /* The closure of our dependencies: each object's own l_initfini (same field) is itself
     * followed by its direct dependencies, NULL-terminated. */
    unsigned char in_closure[MAX_OBJECTS];
    for (long i = 0; i < n; i++)
        in_closure[i] = 0;
    in_closure[ours] = 1;
    for (int changed = 1; changed;) {
        changed = 0;
        for (long i = 0; i < n; i++) {
            if (!in_closure[i])
                continue;
            struct link_map **deps = ((struct link_map ***)initfini[i])[field];
            if (deps == NULL)
                continue;
            if (deps[0] != initfini[i]) {
                order_result = ORDER_UNRECOGNISED;
                return;
            }
            for (long d = 1; deps[d] != NULL; d++) {
                long j = index_of(initfini, n, deps[d]);
                if (j < 0) {
                    order_result = ORDER_UNRECOGNISED;
                    return;
                }
                if (!in_closure[j]) {
                    in_closure[j] = 1;
                    changed = 1;
                }
            }
        }
    }
    /* A dependency of ours that comes before us in the array would be initialised after us
     * whatever we do (nothing we may move): leave the order alone. */
    for (long i = 0; i < ours; i++)
        if (in_closure[i]) {
            order_result = ORDER_UNRECOGNISED;
            return;
        }
    struct link_map *reordered[MAX_OBJECTS];
    long k = 0;
    for (long i = ours + 1; i < n; i++)
        if (!in_closure[i])
            reordered[k++] = initfini[i];
    if (k == 0) {
        order_result = ORDER_ALREADY_FIRST;
        return;
    }
    reordered[k++] = initfini[ours];
    for (long i = ours + 1; i < n; i++)
        if (in_closure[i])
            reordered[k++] = initfini[i];
    for (long i = 0; i < k; i++)
        initfini[ours + i] = reordered[i];
    order_result = ORDER_MOVED;
}

/* What `oxg_init_order_anchor` resolves to: never called. */
static void init_order_anchor(void) {}

/* The resolver: runs once, while the loader relocates this object. */
typedef void (*anchor_fn)(void);
static anchor_fn resolve_init_order_anchor(void) {
    if (order_result == ORDER_NOT_RUN)
        move_ourselves_first();
    return init_order_anchor;
}

static void oxg_init_order_anchor(void) __attribute__((ifunc("resolve_init_order_anchor")));
/* A pointer to the IFUNC in data: the relocation that makes the loader call the resolver. */
static void (*volatile oxg_init_order_anchor_ref)(void) = oxg_init_order_anchor;

/* What the resolver did (the values above); read by init_order.rs, whose reference also
 * keeps this file, and the relocation, in the library. */
__attribute__((visibility("hidden"))) int oxg_init_order_result(void) {
    (void)oxg_init_order_anchor_ref;
    return order_result;
}
