/* Op slots by name: what supports_op implementations and tests look ops up by. */
#include <string.h>

#include "backend/op_names.h"

#define MOE_OP_NAME(f) {#f, offsetof(moe_ops, f)},
static const struct {
    const char *name;
    size_t offset;
} op_list[] = {MOE_OPS_LIST(MOE_OP_NAME)};

_Static_assert(sizeof op_list / sizeof op_list[0] == MOE_OPS_COUNT, "MOE_OPS_LIST must name every op slot");

int32_t moe_op_slot_present(const moe_ops *t, const char *name)
{
    if (!t || !name) return 0;
    for (size_t i = 0; i < sizeof op_list / sizeof op_list[0]; i++)
        if (strcmp(op_list[i].name, name) == 0) {
            void (*fn)(void);
            memcpy(&fn, (const char *)t + op_list[i].offset, sizeof fn);
            return fn != NULL;
        }
    return 0;
}

int32_t moe_op_table_complete(const moe_ops *t, const char **missing)
{
    for (size_t i = 0; i < sizeof op_list / sizeof op_list[0]; i++)
        if (!moe_op_slot_present(t, op_list[i].name)) {
            if (missing) *missing = op_list[i].name;
            return 0;
        }
    return 1;
}
