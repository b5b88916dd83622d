/* arch.c: the table of supported architectures. */
#include <string.h>

#include "internal.h"

static const cr_arch *const k_archs[] = {
    &cr_arch_snac,
    &cr_arch_s3gen,
    &cr_arch_wavtokenizer,
    &cr_arch_neucodec,
    &cr_arch_xcodec2,
    &cr_arch_dac,
    &cr_arch_mimi,
    &cr_arch_qwen3,
};

const cr_arch *cr_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof(k_archs) / sizeof(k_archs[0]); i++) {
        if (strcmp(k_archs[i]->name, name) == 0) {
            return k_archs[i];
        }
    }
    return NULL;
}

const char *cr_arch_names(void) { return "snac, s3gen, wavtokenizer, neucodec, xcodec2, dac, mimi, qwen3"; }
