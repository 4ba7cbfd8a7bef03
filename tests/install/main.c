/*
 * Install test consumer: built against an installed libmoe, once through CMake's
 * find_package(moe) and once through pkg-config. Uses the public header only.
 */
#include <moe.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    const char *version = moe_version_string();
    if (version == NULL || version[0] == '\0') {
        fprintf(stderr, "moe_version_string() returned nothing\n");
        return 1;
    }
    /* The installed header and the installed library must agree. */
    if (moe_version_number() != MOE_VERSION_NUMBER) {
        fprintf(stderr, "header version %d but library version %u\n", MOE_VERSION_NUMBER,
                (unsigned)moe_version_number());
        return 1;
    }
    uint64_t features = moe_build_features();
    if (!(features & MOE_FEATURE_CPU)) {
        fprintf(stderr, "moe_build_features() lacks MOE_FEATURE_CPU\n");
        return 1;
    }

    moe_context_config cfg;
    int32_t st = moe_context_config_init(&cfg, sizeof cfg);
    moe_context *ctx = NULL;
    if (st == MOE_OK) st = moe_context_create(&cfg, &ctx);
    if (st != MOE_OK || ctx == NULL) {
        char msg[256] = "";
        moe_last_error(msg, sizeof msg);
        fprintf(stderr, "moe_context_create: %s (%s)\n", moe_status_name(st), msg);
        return 1;
    }
    int32_t threads = 0;
    st = moe_context_num_threads(ctx, &threads);
    if (st != MOE_OK || threads < 1) {
        fprintf(stderr, "moe_context_num_threads: %s, %d\n", moe_status_name(st), (int)threads);
        moe_context_destroy(ctx);
        return 1;
    }
    moe_context_destroy(ctx);
    moe_context_destroy(NULL); /* a no-op by contract */

    if (strcmp(moe_status_name(MOE_OK), "MOE_OK") != 0) {
        fprintf(stderr, "moe_status_name(MOE_OK) = %s\n", moe_status_name(MOE_OK));
        return 1;
    }
    printf("libmoe %s (features 0x%llx, %d threads): context created and destroyed\n", version,
           (unsigned long long)features, (int)threads);
    return 0;
}
