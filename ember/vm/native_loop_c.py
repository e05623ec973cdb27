"""The native VM's interpreter loop and the API its Python binding calls (``ember.vm.native``);
objects, programs and builtins are in ``native_c``, whose source this one follows.

Instructions arrive as one int64 word array per function (``vm_set_func``): the opcode, then
its operands in the instruction's field order, register lists and shapes prefixed by their
length, dtypes and devices as indices the binding assigned (a device index of -1: a device
this VM does not have). The binding verifies the executable before encoding it, so register
numbers, jump targets and indices are in range here.
"""

SOURCE = r"""
/* ------------------------------------------------------------------ the interpreter */

static int grow_regs(VM *vm, int64_t need) {
    if (need <= vm->regs_cap) return 0;
    int64_t cap = vm->regs_cap ? vm->regs_cap : 256;
    while (cap < need) cap *= 2;
    Obj **r = realloc(vm->regs, sizeof(Obj *) * (size_t)cap);
    if (!r) return fail(vm, "out of memory for the register file");
    memset(r + vm->regs_cap, 0, sizeof(Obj *) * (size_t)(cap - vm->regs_cap));
    vm->regs = r; vm->regs_cap = cap;
    return 0;
}

static int push_frame(VM *vm, int64_t depth, Frame f) {
    if (depth >= vm->max_depth)
        return fail(vm, "call depth exceeded %ld frames; is the recursion unbounded?",
                    (long)vm->max_depth);
    if (depth >= vm->frames_cap) {
        int64_t cap = vm->frames_cap ? vm->frames_cap * 2 : 64;
        Frame *fr = realloc(vm->frames, sizeof(Frame) * (size_t)cap);
        if (!fr) return fail(vm, "out of memory for the call stack");
        vm->frames = fr; vm->frames_cap = cap;
    }
    vm->frames[depth] = f;
    return 0;
}

static void clear_regs(VM *vm, int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) { unref(vm, vm->regs[i]); vm->regs[i] = NULL; }
}

static int need(VM *vm, const Obj *o, int kind, const char *what) {
    if (o && o->kind == kind) return 0;
    return fail(vm, "%s needs %s, got %s", what, kind == K_STORAGE ? "a storage" : kind == K_ADT
                ? "an ADT" : kind == K_CLOSURE ? "a closure" : "a tensor", kind_name(o));
}

static Obj *adt_new(VM *vm, int kind, int64_t tag, const int64_t *regs, int64_t n, Obj **R) {
    Obj *o = obj_new(vm, kind);
    if (!o) { fail(vm, "out of memory"); return NULL; }
    o->tag = tag;
    o->fields = n ? malloc(sizeof(Obj *) * (size_t)n) : NULL;
    if (n && !o->fields) { unref(vm, o); fail(vm, "out of memory"); return NULL; }
    o->n = (int32_t)n;
    for (int64_t i = 0; i < n; ++i) o->fields[i] = ref(R[regs[i]]);
    return o;
}

/* ---- the straight-line instructions: each puts its result in its destination register */

static int op_alloc_storage(VM *vm, Obj **R, const int64_t *c) {   /* size, align, dev, dst */
    int64_t size;
    if (int_of(vm, R[c[1]], "alloc_storage's size", &size)) return -1;
    if (c[3] < 0)
        return fail(vm, "alloc_storage on device @dev%ld: this VM only has ('cpu',); compile "
                    "the model for one of them", (long)(-1 - c[3]));
    if (size < 0) return fail(vm, "alloc_storage of %ld bytes: the size must be >= 0",
                              (long)size);
    if (c[2] <= 0 || (c[2] & (c[2] - 1)) || c[2] > 64)
        return fail(vm, "alloc_storage: alignment %ld is not a power of two up to 64",
                    (long)c[2]);
    Obj *s = storage_new(vm, size);
    if (!s) return -1;
    put(vm, &R[c[4]], s);
    return 0;
}

static int op_alloc_tensor(VM *vm, Obj **R, const int64_t *c) {
    int64_t off, shape[MAXDIM];
    int nd;
    const int64_t *dims = shape;
    if (c[0] == OP_ALLOC_TENSOR) {      /* storage, offset, dtype, dst, ndim, dims */
        if (int_of(vm, R[c[2]], "alloc_tensor's offset", &off)) return -1;
        nd = (int)c[5]; dims = c + 6;
    } else {                            /* storage, offset, shape, dtype, dst */
        if (int_of(vm, R[c[2]], "alloc_tensor_reg's offset", &off) ||
            shape_from(vm, R[c[3]], "alloc_tensor_reg", shape, &nd)) return -1;
    }
    int reg = c[0] == OP_ALLOC_TENSOR;
    Obj *t = view(vm, R[c[1]], off, dims, nd, (int32_t)c[reg ? 3 : 4],
                  reg ? "alloc_tensor" : "alloc_tensor_reg");
    if (!t) return -1;
    put(vm, &R[c[reg ? 4 : 5]], t);
    return 0;
}

static int op_get(VM *vm, Obj **R, const int64_t *c) {   /* get_field obj, index, dst | tag */
    Obj *o = R[c[1]];
    if (c[0] == OP_GET_TAG) {
        if (need(vm, o, K_ADT, "get_tag")) return -1;
        Obj *t = scalar_new(vm, o->tag, 0);
        if (!t) return -1;
        put(vm, &R[c[2]], t);
        return 0;
    }
    if (!o || (o->kind != K_ADT && o->kind != K_CLOSURE) || c[2] >= o->n) {
        if (o && o->kind == K_ADT)
            return fail(vm, "get_field %ld of ADT(tag=%ld, %d fields): no such field",
                        (long)c[2], (long)o->tag, o->n);
        return fail(vm, "get_field %ld of %s: no such field", (long)c[2], kind_name(o));
    }
    put(vm, &R[c[3]], ref(o->fields[c[2]]));
    return 0;
}

static int op_device_copy(VM *vm, Obj **R, const int64_t *c) {   /* src, devices, dst */
    Obj *src = R[c[1]];
    if (c[2] < 0 || c[3] < 0)
        return fail(vm, "device_copy to/from @dev%ld: this VM only has ('cpu',)",
                    (long)(-1 - (c[2] < 0 ? c[2] : c[3])));
    if (need(vm, src, K_TENSOR, "device_copy")) return -1;
    Obj *s = storage_new(vm, src->nbytes);
    if (!s) return -1;
    Obj *t = view(vm, s, 0, src->shape, src->ndim, src->dtype, "device_copy");
    unref(vm, s);
    if (!t) return -1;
    memcpy(t->data, src->data, (size_t)src->nbytes);
    put(vm, &R[c[4]], t);
    return 0;
}

static int op_shape(VM *vm, Obj **R, const int64_t *c) {   /* shape_of | reshape_tensor */
    Obj *src = R[c[1]], *t;
    if (need(vm, src, K_TENSOR, c[0] == OP_SHAPE_OF ? "shape_of" : "reshape_tensor")) return -1;
    if (c[0] == OP_SHAPE_OF) {
        if (!(t = obj_new(vm, K_TENSOR))) return fail(vm, "out of memory");
        memcpy(t->inl, src->shape, sizeof(int64_t) * (size_t)src->ndim);
        t->data = (char *)t->inl; t->dtype = 0; t->ndim = 1; t->shape[0] = src->ndim;
        t->nbytes = 8 * src->ndim;
        put(vm, &R[c[2]], t);
        return 0;
    }
    int64_t shape[MAXDIM], n = 1;
    int nd;
    if (shape_from(vm, R[c[2]], "reshape_tensor", shape, &nd)) return -1;
    for (int i = 0; i < nd; ++i) n *= shape[i];
    if (n != numel(src))
        return fail(vm, "reshape_tensor of a tensor of %ld elements to a shape of %ld "
                    "elements: the element counts differ", (long)numel(src), (long)n);
    if (!(t = obj_new(vm, K_TENSOR))) return fail(vm, "out of memory");
    *t = *src; t->refs = 1; t->ndim = nd; t->next = NULL;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)nd);
    int inline_data = src->data == (char *)src->inl;
    if (inline_data) t->data = (char *)t->inl;
    t->base = inline_data ? NULL : ref(src->base);
    put(vm, &R[c[3]], t);
    return 0;
}

static int straight(VM *vm, Obj **R, const int64_t *c) {
    switch (c[0]) {
    case OP_MOVE: put(vm, &R[c[2]], ref(R[c[1]])); return 0;
    case OP_LOAD_CONST: put(vm, &R[c[2]], ref(vm->consts[c[1]])); return 0;
    case OP_LOAD_CONSTI: {
        Obj *t = scalar_new(vm, c[1], 0);   /* dtype 0 is int64 */
        if (!t) return -1;
        put(vm, &R[c[2]], t);
        return 0;
    }
    case OP_ALLOC_STORAGE: return op_alloc_storage(vm, R, c);
    case OP_ALLOC_TENSOR: case OP_ALLOC_TENSOR_REG: return op_alloc_tensor(vm, R, c);
    case OP_ALLOC_ADT: case OP_ALLOC_CLOSURE: {   /* tag/func, dst, n, regs */
        Obj *o = adt_new(vm, c[0] == OP_ALLOC_ADT ? K_ADT : K_CLOSURE, c[1], c + 4, c[3], R);
        if (!o) return -1;
        put(vm, &R[c[2]], o);
        return 0;
    }
    case OP_GET_FIELD: case OP_GET_TAG: return op_get(vm, R, c);
    case OP_DEVICE_COPY: return op_device_copy(vm, R, c);
    case OP_SHAPE_OF: case OP_RESHAPE_TENSOR: return op_shape(vm, R, c);
    case OP_KILL_REGISTER: put(vm, &R[c[1]], NULL); return 0;
    case OP_INVOKE_PACKED: {   /* index, n, regs */
        Obj *a[c[2] + 1];
        for (int64_t i = 0; i < c[2]; ++i) a[i] = R[c[3 + i]];
        return invoke_packed(vm, c[1], a, (int)c[2]);
    }
    }
    return fail(vm, "unknown opcode %ld", (long)c[0]);
}

/* ---- calls and returns: the frame state of the loop */

typedef struct { int32_t fidx, pc; int64_t base, depth; } State;

/* invoke / invoke_closure (func or closure, dst, n, regs): enter the callee */
static int call(VM *vm, State *st, const int64_t *c) {
    Obj **R = vm->regs + st->base;
    int64_t n = c[3], k = 0;
    int32_t g = (int32_t)c[1];
    Obj *clo = NULL;
    if (c[0] == OP_INVOKE_CLOSURE) {
        clo = R[c[1]];
        if (need(vm, clo, K_CLOSURE, "invoke_closure")) return -1;
        g = (int32_t)clo->tag;
        k = clo->n;
    }
    Func *f = &vm->funcs[st->fidx], *callee = &vm->funcs[g];
    if (k + n != callee->nparams)
        return fail(vm, "closure of @fn%d takes %ld argument(s) after its %ld captured "
                    "value(s), got %ld", g, (long)(callee->nparams - k), (long)k, (long)n);
    int64_t nb = st->base + f->nregs;
    Frame fr = {st->fidx, st->pc, st->base, (int32_t)c[2]};
    if (push_frame(vm, st->depth, fr) || grow_regs(vm, nb + callee->nregs)) return -1;
    R = vm->regs + st->base;   /* (the register file may have moved) */
    clo = c[0] == OP_INVOKE_CLOSURE ? R[c[1]] : NULL;
    for (int64_t i = 0; i < k; ++i) vm->regs[nb + i] = ref(clo->fields[i]);
    for (int64_t i = 0; i < n; ++i) vm->regs[nb + k + i] = ref(R[c[4 + i]]);
    st->depth++; st->fidx = g; st->pc = 0; st->base = nb;
    vm->stats.calls++;
    return 0;
}

/* ret: the result goes to the caller's destination register; 1 when the run is over */
static int ret(VM *vm, State *st, const int64_t *c, Obj **result) {
    Func *f = &vm->funcs[st->fidx];
    Obj *r = ref(vm->regs[st->base + c[1]]);
    clear_regs(vm, st->base, st->base + f->nregs);
    if (st->depth == 0) { *result = r; return 1; }
    Frame fr = vm->frames[--st->depth];
    st->fidx = fr.func; st->pc = fr.pc + 1; st->base = fr.base;
    put(vm, &vm->regs[fr.base + fr.dst], r);
    return 0;
}

static Obj *interpret(VM *vm, int32_t fidx, Obj **args, int64_t nargs) {
    State st = {fidx, 0, 0, 0};
    if (grow_regs(vm, vm->funcs[fidx].nregs)) {
        for (int64_t i = 0; i < nargs; ++i) unref(vm, args[i]);
        return NULL;
    }
    for (int64_t i = 0; i < nargs; ++i) vm->regs[i] = args[i];
    int64_t n_ins = 0;
    Obj *result = NULL;
    for (;;) {
        const Func *f = &vm->funcs[st.fidx];
        const int64_t *c = f->code + f->offs[st.pc];
        Obj **R = vm->regs + st.base;
        ++n_ins;
        if (c[0] == OP_IF) {
            int64_t a, b; double da, db; int fa, fb;
            if (scalar(vm, R[c[1]], "if", &a, &da, &fa) ||
                scalar(vm, R[c[2]], "if", &b, &db, &fb)) break;
            int eq = (fa || fb) ? (fa ? da : (double)a) == (fb ? db : (double)b) : a == b;
            st.pc += (int32_t)(eq ? c[3] : c[4]);
        } else if (c[0] == OP_GOTO) {
            st.pc += (int32_t)c[1];
        } else if (c[0] == OP_INVOKE || c[0] == OP_INVOKE_CLOSURE) {
            if (call(vm, &st, c)) break;
        } else if (c[0] == OP_RET) {
            if (ret(vm, &st, c, &result)) { vm->stats.instructions += n_ins; return result; }
        } else if (c[0] == OP_FATAL) {
            vm->err_kind = E_FATAL; vm->err_aux = c[1];
            break;
        } else {
            vm->cur_func = st.fidx; vm->cur_pc = st.pc;
            if (straight(vm, R, c)) break;
            ++st.pc;
        }
    }
    vm->stats.instructions += n_ins;
    vm->err_func = st.fidx; vm->err_pc = st.pc; vm->err_depth = st.depth;
    for (int64_t k = 0; k < 4 && k < st.depth; ++k) {
        vm->err_stack[2 * k] = vm->frames[st.depth - 1 - k].func;
        vm->err_stack[2 * k + 1] = vm->frames[st.depth - 1 - k].pc;
    }
    clear_regs(vm, 0, st.base + vm->funcs[st.fidx].nregs);
    return NULL;
}

/* ------------------------------------------------------------------ the API */

void vm_free(VM *vm);

VM *vm_new(int nfuncs, int nconsts, int npacked, int nprogs, int64_t max_depth, py_fn pycb,
           prog_fn progcb) {
    VM *vm = calloc(1, sizeof(VM));
    if (!vm) return NULL;
    vm->funcs = calloc((size_t)nfuncs + 1, sizeof(Func));
    vm->consts = calloc((size_t)nconsts + 1, sizeof(Obj *));
    vm->packed = calloc((size_t)npacked + 1, sizeof(Packed));
    vm->progs = calloc((size_t)nprogs + 1, sizeof(Prog));
    if (!vm->funcs || !vm->consts || !vm->packed || !vm->progs) { vm_free(vm); return NULL; }
    vm->nfuncs = nfuncs; vm->nconsts = nconsts; vm->npacked = npacked; vm->nprogs = nprogs;
    vm->max_depth = max_depth; vm->pycb = pycb; vm->progcb = progcb;
    return vm;
}

void vm_set_dtype(VM *vm, int i, int size, int kind) {
    if (i >= 0 && i < NDTYPES) { vm->dt_size[i] = size; vm->dt_kind[i] = (int8_t)kind; }
}

/* the words stay owned by the caller, who keeps them alive */
void vm_set_func(VM *vm, int i, int nparams, int nregs, int ninstr, const int64_t *code,
                 const int64_t *offs) {
    Func f = {nparams, nregs, ninstr, code, offs};
    vm->funcs[i] = f;
}

Obj *vm_tensor(VM *vm, char *data, int dtype, int ndim, const int64_t *shape, int flags) {
    if (ndim < 0 || ndim > MAXDIM) return NULL;
    Obj *t = obj_new(vm, K_TENSOR);
    if (!t) return NULL;
    t->data = data; t->dtype = dtype; t->ndim = ndim; t->flags = flags;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->nbytes = vm->dt_size[dtype];
    for (int i = 0; i < ndim; ++i) t->nbytes *= shape[i];
    return t;
}

/* an ADT (kind 3) or closure (kind 4) taking over the references in fields */
Obj *vm_adt(VM *vm, int kind, int64_t tag, int n, Obj **fields) {
    Obj *o = obj_new(vm, kind == K_CLOSURE ? K_CLOSURE : K_ADT);
    Obj **f = n > 0 ? malloc(sizeof(Obj *) * (size_t)n) : NULL;
    if (!o || (n > 0 && !f)) {
        for (int i = 0; i < n; ++i) unref(vm, fields[i]);
        free(f);
        if (o) unref(vm, o);
        return NULL;
    }
    o->tag = tag; o->n = n; o->fields = f;
    for (int i = 0; i < n; ++i) o->fields[i] = fields[i];
    return o;
}

void vm_set_const(VM *vm, int i, Obj *t) { vm->consts[i] = t; }

void vm_set_packed(VM *vm, int i, int kind, int64_t *params, int64_t np) {
    Packed pk = {kind, params, np};
    vm->packed[i] = pk;
}

void vm_set_program(VM *vm, int i, void *run, void *set_dims, int64_t *dims_cell, int n_in,
                    int n_out, const int32_t *in_dtype, const int32_t *out_dtype) {
    Prog *p = &vm->progs[i];
    p->run = (run_fn)run; p->set_dims = (setdims_fn)set_dims; p->dims_cell = dims_cell;
    p->n_in = n_in; p->n_out = n_out;
    memcpy(p->in_dtype, in_dtype, sizeof(int32_t) * (size_t)n_in);
    memcpy(p->out_dtype, out_dtype, sizeof(int32_t) * (size_t)n_out);
}

static int64_t *dup_words(const int64_t *w, int64_t n) {
    int64_t *d = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (d && n) memcpy(d, w, sizeof(int64_t) * (size_t)n);
    return d;
}

/* words: in shapes (ndim, dims per input), out shapes (same), then key and offsets */
int vm_memo_put(VM *vm, int i, const int64_t *shapes, int64_t n_shapes, const int64_t *key,
                int64_t n_key, const int64_t *offsets, int64_t n_off, int64_t ws) {
    Prog *p = &vm->progs[i];
    int e = p->n_memo < MEMO_N ? p->n_memo++ : p->next_slot++ % MEMO_N;
    Memo *m = &p->memo[e];
    free(m->in_shapes); free(m->key); free(m->offsets);
    const int64_t *s = shapes;
    for (int k = 0; k < p->n_in; ++k) s += 1 + s[0];
    m->in_shapes = dup_words(shapes, n_shapes);
    m->out_shapes = m->in_shapes ? m->in_shapes + (s - shapes) : NULL;
    m->key = dup_words(key, n_key);
    m->offsets = dup_words(offsets, n_off);
    m->ws = ws;
    m->id = p->next_id++;
    p->last = e;
    return m->in_shapes && m->key && m->offsets ? 0 : -1;
}

Obj *vm_run(VM *vm, int func, int nargs, Obj **args) {
    if (vm->running) {
        for (int i = 0; i < nargs; ++i) unref(vm, args[i]);
        fail(vm, "the VM was called again while it runs (from one of its packed functions); "
             "use another VMModel for nested runs");
        vm->err_func = func; vm->err_pc = 0;
        return NULL;
    }
    int64_t t0 = now_ns();
    vm->running = 1;
    vm->err_kind = E_NONE; vm->err_msg[0] = 0; vm->err_depth = 0;
    Obj *r = interpret(vm, func, args, nargs);
    vm->stats.total_ns += now_ns() - t0;
    vm->stats.runs++;
    vm->running = 0;
    return r;
}

void vm_release(VM *vm, Obj *o) { unref(vm, o); }

int64_t vm_describe(VM *vm, const Obj *o, int64_t *w, int64_t cap);
int64_t vm_copied_bytes(const int64_t *w, int64_t used);

/* a run whose arguments are all tensors: desc holds (data, dtype, ndim, flags, dims...) each;
   the result is described into w (w[0]: the words used or < 0 when cap is too small, w[1]:
   the bytes vm_take copies, the words from w[2]) */
Obj *vm_run_desc(VM *vm, int func, int nargs, const int64_t *desc, int64_t *w, int64_t cap) {
    Obj *args[nargs + 1];
    for (int i = 0; i < nargs; ++i) {
        args[i] = vm_tensor(vm, (char *)(intptr_t)desc[0], (int)desc[1], (int)desc[2], desc + 4,
                            (int)desc[3]);
        if (!args[i]) {
            for (int k = 0; k < i; ++k) unref(vm, args[k]);
            fail(vm, "out of memory");
            vm->err_func = func; vm->err_pc = 0;
            return NULL;
        }
        desc += 4 + desc[2];
    }
    Obj *r = vm_run(vm, func, nargs, args);
    if (r) {
        w[0] = vm_describe(vm, r, w + 2, cap - 2);
        w[1] = w[0] > 0 ? vm_copied_bytes(w + 2, w[0]) : 0;
    }
    return r;
}

/* the bytes vm_copy_out writes for a tree vm_describe gave in w[0..used) (each tensor and
   storage at a 64-byte aligned offset) */
int64_t vm_copied_bytes(const int64_t *w, int64_t used) {
    int64_t total = 0;
    for (int64_t i = 0; i < used;) {
        int64_t k = w[i];
        if (k == K_TENSOR) { total += (w[i + 4] + 63) / 64 * 64; i += 6 + w[i + 2]; }
        else if (k == K_STORAGE) { total += (w[i + 2] + 63) / 64 * 64; i += 3; }
        else i += k == 0 ? 1 : 3;
    }
    return total;
}

typedef struct { const Obj **a; int64_t n, cap; } Stack;

static int spush(Stack *s, const Obj *o) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        const Obj **a = realloc(s->a, sizeof(Obj *) * (size_t)cap);
        if (!a) return -1;
        s->a = a; s->cap = cap;
    }
    s->a[s->n++] = o;
    return 0;
}

/* pushes o's fields, last first (so they pop in order) */
static int spush_fields(Stack *s, const Obj *o) {
    if (o->kind != K_ADT && o->kind != K_CLOSURE) return 0;
    for (int i = o->n - 1; i >= 0; --i) if (spush(s, o->fields[i])) return -1;
    return 0;
}

/* an object tree in preorder: tensor (1, dtype, ndim, data, nbytes, flags, dims...), storage
   (2, data, nbytes), ADT (3, tag, n) or closure (4, function, n) then its fields, an empty
   register 0; the words used, -1 past cap, -2 out of memory. No recursion. */
int64_t vm_describe(VM *vm, const Obj *o, int64_t *w, int64_t cap) {
    Stack st = {0};
    int64_t used = 0, rc = 0;
    if (spush(&st, o)) return -2;
    while (st.n && rc == 0) {
        const Obj *x = st.a[--st.n];
        int64_t need = !x ? 1 : x->kind == K_TENSOR ? 6 + x->ndim : 3;
        if (used + need > cap) { rc = -1; break; }
        int64_t *d = w + used;
        used += need;
        if (!x) { d[0] = 0; continue; }
        d[0] = x->kind;
        if (x->kind == K_TENSOR) {
            d[1] = x->dtype; d[2] = x->ndim; d[3] = (int64_t)(intptr_t)x->data;
            d[4] = x->nbytes; d[5] = x->flags;
            memcpy(d + 6, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        } else if (x->kind == K_STORAGE) {
            d[1] = (int64_t)(intptr_t)x->data; d[2] = x->nbytes;
        } else {
            d[1] = x->tag; d[2] = x->n;
            if (spush_fields(&st, x)) rc = -2;
        }
    }
    free(st.a);
    (void)vm;
    return rc ? rc : used;
}

/* copies the tree's tensors and storages, in preorder, into one buffer at base: each at the
   next 64-byte aligned offset; returns the offset after the last (-1: out of memory) */
int64_t vm_copy_out(VM *vm, const Obj *o, char *base, int64_t off) {
    Stack st = {0};
    if (spush(&st, o)) return -1;
    while (st.n) {
        const Obj *x = st.a[--st.n];
        if (!x) continue;
        if (x->kind == K_TENSOR || x->kind == K_STORAGE) {
            if (x->nbytes) memcpy(base + off, x->data, (size_t)x->nbytes);
            off += (x->nbytes + 63) / 64 * 64;
        } else if (spush_fields(&st, x)) { off = -1; break; }
    }
    free(st.a);
    (void)vm;
    return off;
}

/* vm_copy_out into base, then the reference dropped */
int64_t vm_take(VM *vm, Obj *o, char *base) {
    int64_t end = base ? vm_copy_out(vm, o, base, 0) : 0;
    unref(vm, o);
    return end;
}

void vm_free(VM *vm) {
    if (!vm) return;
    clear_regs(vm, 0, vm->regs_cap);
    for (int i = 0; i < vm->nconsts; ++i) unref(vm, vm->consts[i]);
    for (int i = 0; i < vm->nprogs; ++i) {
        Prog *p = &vm->progs[i];
        for (int e = 0; e < p->n_memo; ++e) {
            free(p->memo[e].in_shapes); free(p->memo[e].key); free(p->memo[e].offsets);
        }
        free(p->ws_raw);
    }
    for (int i = 0; i < vm->pool_n; ++i) free(vm->pool_ptr[i]);
    while (vm->free_objs) { Obj *o = vm->free_objs; vm->free_objs = o->next; free(o); }
    free(vm->regs); free(vm->frames); free(vm->funcs); free(vm->consts); free(vm->packed);
    free(vm->progs); free(vm);
}
"""
