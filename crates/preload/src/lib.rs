//! libremem_preload.so: loaded into an unmodified program with LD_PRELOAD by `remem run
//! --paging uffd`, it starts remem-paging's handler before `main` and reports at exit. Only
//! the glue lives here: the allocator every Rust allocation of the library uses (the pager's
//! own arena, never the program's malloc) and the constructor and destructor.

#[global_allocator]
static ALLOCATOR: remem_paging::arena::Arena = remem_paging::arena::Arena;

extern "C" fn start() {
    remem_paging::start();
}

extern "C" fn finish() {
    remem_paging::finish();
}

#[used]
#[link_section = ".init_array"]
static START: extern "C" fn() = start;

#[used]
#[link_section = ".fini_array"]
static FINISH: extern "C" fn() = finish;
