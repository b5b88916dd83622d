/*
 * PLACEHOLDER written by the lead so the tree builds and GGUF files load while
 * the real HiFT vocoder is written: the full tensor list, outputs of zeros. The
 * component's author replaces this whole file.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "s3gen.h"

struct ggml_tensor *s3_w(struct ggml_context *w, const char *fmt, ...) {
    char name[GGML_MAX_NAME];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    return ggml_get_tensor(w, name);
}

void s3_hift_specs(const s3gen_hparams *hp, cr_spec_list *s) {
    (void)hp;
    cr_spec_add(s, false, 2, 9, 1, "hift.m_source.l_linear.weight");
    cr_spec_add(s, false, 1, 1, 1, "hift.m_source.l_linear.bias");
    cr_spec_add(s, false, 1, 512, 1, "hift.conv_pre.bias");
    cr_spec_add3(s, true, 7, 80, 512, "hift.conv_pre.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.ups.0.bias");
    cr_spec_add3(s, true, 16, 256, 512, "hift.ups.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.ups.1.bias");
    cr_spec_add3(s, true, 11, 128, 256, "hift.ups.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.ups.2.bias");
    cr_spec_add3(s, true, 7, 64, 128, "hift.ups.2.weight");
    cr_spec_add3(s, true, 30, 18, 256, "hift.source_downs.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_downs.0.bias");
    cr_spec_add3(s, true, 6, 18, 128, "hift.source_downs.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_downs.1.bias");
    cr_spec_add3(s, false, 1, 18, 64, "hift.source_downs.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_downs.2.bias");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.convs1.0.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.source_resblocks.0.convs1.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.convs1.1.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.source_resblocks.0.convs1.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.convs1.2.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.source_resblocks.0.convs1.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.convs2.0.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.source_resblocks.0.convs2.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.convs2.1.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.source_resblocks.0.convs2.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.convs2.2.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.source_resblocks.0.convs2.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.activations1.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.activations1.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.activations1.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.activations2.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.activations2.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.source_resblocks.0.activations2.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.convs1.0.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.source_resblocks.1.convs1.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.convs1.1.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.source_resblocks.1.convs1.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.convs1.2.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.source_resblocks.1.convs1.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.convs2.0.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.source_resblocks.1.convs2.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.convs2.1.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.source_resblocks.1.convs2.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.convs2.2.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.source_resblocks.1.convs2.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.activations1.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.activations1.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.activations1.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.activations2.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.activations2.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.source_resblocks.1.activations2.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.convs1.0.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.source_resblocks.2.convs1.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.convs1.1.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.source_resblocks.2.convs1.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.convs1.2.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.source_resblocks.2.convs1.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.convs2.0.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.source_resblocks.2.convs2.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.convs2.1.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.source_resblocks.2.convs2.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.convs2.2.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.source_resblocks.2.convs2.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.activations1.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.activations1.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.activations1.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.activations2.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.activations2.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.source_resblocks.2.activations2.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.convs1.0.bias");
    cr_spec_add3(s, true, 3, 256, 256, "hift.resblocks.0.convs1.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.convs1.1.bias");
    cr_spec_add3(s, true, 3, 256, 256, "hift.resblocks.0.convs1.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.convs1.2.bias");
    cr_spec_add3(s, true, 3, 256, 256, "hift.resblocks.0.convs1.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.convs2.0.bias");
    cr_spec_add3(s, true, 3, 256, 256, "hift.resblocks.0.convs2.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.convs2.1.bias");
    cr_spec_add3(s, true, 3, 256, 256, "hift.resblocks.0.convs2.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.convs2.2.bias");
    cr_spec_add3(s, true, 3, 256, 256, "hift.resblocks.0.convs2.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.activations1.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.activations1.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.activations1.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.activations2.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.activations2.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.0.activations2.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.convs1.0.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.resblocks.1.convs1.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.convs1.1.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.resblocks.1.convs1.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.convs1.2.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.resblocks.1.convs1.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.convs2.0.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.resblocks.1.convs2.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.convs2.1.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.resblocks.1.convs2.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.convs2.2.bias");
    cr_spec_add3(s, true, 7, 256, 256, "hift.resblocks.1.convs2.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.activations1.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.activations1.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.activations1.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.activations2.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.activations2.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.1.activations2.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.convs1.0.bias");
    cr_spec_add3(s, true, 11, 256, 256, "hift.resblocks.2.convs1.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.convs1.1.bias");
    cr_spec_add3(s, true, 11, 256, 256, "hift.resblocks.2.convs1.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.convs1.2.bias");
    cr_spec_add3(s, true, 11, 256, 256, "hift.resblocks.2.convs1.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.convs2.0.bias");
    cr_spec_add3(s, true, 11, 256, 256, "hift.resblocks.2.convs2.0.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.convs2.1.bias");
    cr_spec_add3(s, true, 11, 256, 256, "hift.resblocks.2.convs2.1.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.convs2.2.bias");
    cr_spec_add3(s, true, 11, 256, 256, "hift.resblocks.2.convs2.2.weight");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.activations1.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.activations1.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.activations1.2.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.activations2.0.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.activations2.1.alpha");
    cr_spec_add(s, false, 1, 256, 1, "hift.resblocks.2.activations2.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.convs1.0.bias");
    cr_spec_add3(s, true, 3, 128, 128, "hift.resblocks.3.convs1.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.convs1.1.bias");
    cr_spec_add3(s, true, 3, 128, 128, "hift.resblocks.3.convs1.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.convs1.2.bias");
    cr_spec_add3(s, true, 3, 128, 128, "hift.resblocks.3.convs1.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.convs2.0.bias");
    cr_spec_add3(s, true, 3, 128, 128, "hift.resblocks.3.convs2.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.convs2.1.bias");
    cr_spec_add3(s, true, 3, 128, 128, "hift.resblocks.3.convs2.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.convs2.2.bias");
    cr_spec_add3(s, true, 3, 128, 128, "hift.resblocks.3.convs2.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.activations1.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.activations1.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.activations1.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.activations2.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.activations2.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.3.activations2.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.convs1.0.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.resblocks.4.convs1.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.convs1.1.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.resblocks.4.convs1.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.convs1.2.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.resblocks.4.convs1.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.convs2.0.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.resblocks.4.convs2.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.convs2.1.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.resblocks.4.convs2.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.convs2.2.bias");
    cr_spec_add3(s, true, 7, 128, 128, "hift.resblocks.4.convs2.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.activations1.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.activations1.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.activations1.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.activations2.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.activations2.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.4.activations2.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.convs1.0.bias");
    cr_spec_add3(s, true, 11, 128, 128, "hift.resblocks.5.convs1.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.convs1.1.bias");
    cr_spec_add3(s, true, 11, 128, 128, "hift.resblocks.5.convs1.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.convs1.2.bias");
    cr_spec_add3(s, true, 11, 128, 128, "hift.resblocks.5.convs1.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.convs2.0.bias");
    cr_spec_add3(s, true, 11, 128, 128, "hift.resblocks.5.convs2.0.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.convs2.1.bias");
    cr_spec_add3(s, true, 11, 128, 128, "hift.resblocks.5.convs2.1.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.convs2.2.bias");
    cr_spec_add3(s, true, 11, 128, 128, "hift.resblocks.5.convs2.2.weight");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.activations1.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.activations1.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.activations1.2.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.activations2.0.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.activations2.1.alpha");
    cr_spec_add(s, false, 1, 128, 1, "hift.resblocks.5.activations2.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.convs1.0.bias");
    cr_spec_add3(s, true, 3, 64, 64, "hift.resblocks.6.convs1.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.convs1.1.bias");
    cr_spec_add3(s, true, 3, 64, 64, "hift.resblocks.6.convs1.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.convs1.2.bias");
    cr_spec_add3(s, true, 3, 64, 64, "hift.resblocks.6.convs1.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.convs2.0.bias");
    cr_spec_add3(s, true, 3, 64, 64, "hift.resblocks.6.convs2.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.convs2.1.bias");
    cr_spec_add3(s, true, 3, 64, 64, "hift.resblocks.6.convs2.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.convs2.2.bias");
    cr_spec_add3(s, true, 3, 64, 64, "hift.resblocks.6.convs2.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.activations1.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.activations1.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.activations1.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.activations2.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.activations2.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.6.activations2.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.convs1.0.bias");
    cr_spec_add3(s, true, 7, 64, 64, "hift.resblocks.7.convs1.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.convs1.1.bias");
    cr_spec_add3(s, true, 7, 64, 64, "hift.resblocks.7.convs1.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.convs1.2.bias");
    cr_spec_add3(s, true, 7, 64, 64, "hift.resblocks.7.convs1.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.convs2.0.bias");
    cr_spec_add3(s, true, 7, 64, 64, "hift.resblocks.7.convs2.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.convs2.1.bias");
    cr_spec_add3(s, true, 7, 64, 64, "hift.resblocks.7.convs2.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.convs2.2.bias");
    cr_spec_add3(s, true, 7, 64, 64, "hift.resblocks.7.convs2.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.activations1.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.activations1.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.activations1.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.activations2.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.activations2.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.7.activations2.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.convs1.0.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.resblocks.8.convs1.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.convs1.1.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.resblocks.8.convs1.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.convs1.2.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.resblocks.8.convs1.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.convs2.0.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.resblocks.8.convs2.0.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.convs2.1.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.resblocks.8.convs2.1.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.convs2.2.bias");
    cr_spec_add3(s, true, 11, 64, 64, "hift.resblocks.8.convs2.2.weight");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.activations1.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.activations1.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.activations1.2.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.activations2.0.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.activations2.1.alpha");
    cr_spec_add(s, false, 1, 64, 1, "hift.resblocks.8.activations2.2.alpha");
    cr_spec_add(s, false, 1, 18, 1, "hift.conv_post.bias");
    cr_spec_add3(s, true, 7, 64, 18, "hift.conv_post.weight");
    cr_spec_add(s, false, 1, 512, 1, "hift.f0_predictor.condnet.0.bias");
    cr_spec_add3(s, true, 3, 80, 512, "hift.f0_predictor.condnet.0.weight");
    cr_spec_add(s, false, 1, 512, 1, "hift.f0_predictor.condnet.2.bias");
    cr_spec_add3(s, true, 3, 512, 512, "hift.f0_predictor.condnet.2.weight");
    cr_spec_add(s, false, 1, 512, 1, "hift.f0_predictor.condnet.4.bias");
    cr_spec_add3(s, true, 3, 512, 512, "hift.f0_predictor.condnet.4.weight");
    cr_spec_add(s, false, 1, 512, 1, "hift.f0_predictor.condnet.6.bias");
    cr_spec_add3(s, true, 3, 512, 512, "hift.f0_predictor.condnet.6.weight");
    cr_spec_add(s, false, 1, 512, 1, "hift.f0_predictor.condnet.8.bias");
    cr_spec_add3(s, true, 3, 512, 512, "hift.f0_predictor.condnet.8.weight");
    cr_spec_add(s, false, 2, 512, 1, "hift.f0_predictor.classifier.weight");
    cr_spec_add(s, false, 1, 1, 1, "hift.f0_predictor.classifier.bias");
}

struct ggml_tensor *s3_f0_build(struct ggml_context *ctx, struct ggml_context *w, const s3gen_hparams *hp,
                                int64_t T, int64_t B, s3_f0_io *io) {
    (void)w; (void)hp;
    io->mel = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, T, 80, B);
    ggml_set_input(io->mel);
    return ggml_scale(ctx, ggml_cont(ctx, ggml_view_2d(ctx, io->mel, T, B, io->mel->nb[2], 0)), 0.0f);
}

void s3_source_host(struct ggml_context *w, const float *f0, int64_t T, const float *phases, const float *noise,
                    float *source) {
    (void)w; (void)f0; (void)phases; (void)noise;
    memset(source, 0, sizeof(float) * (size_t)T * S3_MEL_HOP);
}

struct ggml_tensor *s3_hift_build(struct ggml_context *ctx, struct ggml_context *w, const s3gen_hparams *hp,
                                  int64_t T, int64_t B, bool cpu_ops, s3_hift_io *io) {
    (void)w; (void)hp; (void)cpu_ops;
    io->mel = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, T, 80, B);
    io->source = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, T * S3_MEL_HOP, B);
    ggml_set_input(io->mel); ggml_set_input(io->source);
    return ggml_add(ctx, ggml_scale(ctx, io->source, 0.0f), ggml_scale(ctx, ggml_sum(ctx, io->mel), 0.0f));
}

void s3_hift_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const s3_hift_io *io) {
    (void)hp; (void)T; (void)B; (void)io;
}

int64_t s3_hift_max_elements(int64_t T, int64_t B) { return T * S3_MEL_HOP * 64 * B; }
