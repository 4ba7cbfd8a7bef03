# Reader of the shared binding fixture (tests/bindings/fixture.c), found through MOE_FIXTURE.
#
# Records are `name type ndim d0 .. d{ndim-1} values...`, values row-major. Reshaping them to the
# reversed dims gives exactly the Julia array of the binding's layout convention.

const FIXTURE_TYPES = Dict("f32" => Float32, "f64" => Float64, "i64" => Int64)

function load_fixture()
    path = get(ENV, "MOE_FIXTURE", "")
    isempty(path) && error("MOE_FIXTURE is not set: run scripts/test-julia.sh, or generate the file with " *
                           "`<build>/tests/bindings/moe_fixture OUT.txt` and set MOE_FIXTURE=OUT.txt")
    isfile(path) || error("MOE_FIXTURE=$path: no such file")
    lines = readlines(path)
    (isempty(lines) || strip(lines[1]) != "libmoe-fixture 1") &&
        error("$path: not a libmoe fixture (first line must be `libmoe-fixture 1`)")
    records = Dict{String,Any}()
    for (n, line) in enumerate(lines)
        n == 1 && continue
        words = split(line)
        (isempty(words) || startswith(words[1], "#")) && continue
        T = get(FIXTURE_TYPES, words[2]) do
            error("$path:$n: unknown type $(words[2])")
        end
        ndim = parse(Int, words[3])
        dims = Tuple(parse(Int, w) for w in words[4:3+ndim])
        values = T[parse(T, w) for w in words[4+ndim:end]]
        length(values) == prod(dims) ||
            error("$path:$n: $(words[1]) has $(length(values)) values, expected $(prod(dims))")
        records[words[1]] = ndim == 0 ? values[1] : reshape(values, reverse(dims))
    end
    records
end

# The tolerance every binding uses against the fixture: |a - b| <= 1e-6 + 1e-6 |b|.
function matches(a, b)
    size(a) == size(b) || return false
    all(abs(Float64(x) - Float64(y)) <= 1e-6 + 1e-6 * abs(Float64(y)) for (x, y) in zip(a, b))
end
