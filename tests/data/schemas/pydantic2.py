# Writes the pydantic 2 fixtures of tests/data/schemas (model_json_schema()
# of typical models), one file per model. Run once by hand with a Python
# that has pydantic 2 (the files are committed; no test runs this):
#   python3 tests/data/schemas/pydantic2.py tests/data/schemas
# EmailStr needs the email-validator package; where it is absent the field is
# declared with the schema EmailStr writes ({"format": "email"}), the same bytes.
import datetime, decimal, enum, ipaddress, json, sys, uuid
from typing import Annotated, Dict, List, Literal, Optional, Set, Tuple, Union

import pydantic
from pydantic import AnyUrl, BaseModel, Field

try:
    import email_validator  # noqa: F401
    from pydantic import EmailStr
except ImportError:
    EmailStr = Annotated[str, Field(json_schema_extra={"format": "email"})]


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    street: str
    city: str = Field(min_length=1, max_length=40)
    zip: Optional[str] = None
    country: Literal["DE", "FR", "US"] = "US"


class Node(BaseModel):
    value: int
    children: List["Node"] = []


class User(BaseModel):
    id: uuid.UUID
    name: str = Field(min_length=1, max_length=50)
    age: int = Field(gt=0, le=150)
    score: float = Field(ge=0.0, le=1.0)
    email: EmailStr
    created: datetime.datetime
    address: Address
    color: Color = Color.red
    tags: Dict[str, int] = {}
    point: Tuple[float, float]
    tree: Optional[Node] = None


class Cat(BaseModel):
    pet_type: Literal["cat"]
    meows: int


class Dog(BaseModel):
    pet_type: Literal["dog"]
    barks: float


class Owner(BaseModel):
    pet: Union[Cat, Dog] = Field(discriminator="pet_type")
    n: int = Field(multiple_of=5)
    pets: List[Union[Cat, Dog]] = Field(default=[], max_length=3)


class Item(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    qty: int = Field(ge=1, lt=100)
    kind: Literal["a", "b"]


class Order(BaseModel):
    items: List[Item] = Field(min_length=1, max_length=3)
    day: datetime.date
    at: datetime.time
    groups: Dict[str, List[int]] = {}
    note: Optional[str] = None
    labels: Set[str] = set()


# Decimal is written as anyOf number or a string whose pattern has
# lookaheads: a file of its own.
class Price(BaseModel):
    price: decimal.Decimal = Field(max_digits=6, decimal_places=2)


class Host(BaseModel):
    ip: ipaddress.IPv4Address
    ip6: Optional[ipaddress.IPv6Address] = None
    url: AnyUrl
    ttl: datetime.timedelta
    weight: Annotated[float, Field(gt=-1.5, lt=2.5)]
    port: Annotated[int, Field(ge=1, le=65535)]
    flags: Tuple[bool, ...] = ()
    extra: Dict[str, Union[int, str, None]] = {}


class Employee(BaseModel):
    name: str
    manager: Optional["Employee"] = None
    reports: List["Employee"] = Field(default=[], max_length=2)


MODELS = {"user": User, "owner": Owner, "order": Order, "host": Host, "employee": Employee,
          "decimal": Price}

if __name__ == "__main__":
    out = sys.argv[1]
    for name, model in MODELS.items():
        with open("%s/pydantic2-%s.json" % (out, name), "w") as f:
            json.dump(model.model_json_schema(), f, indent=1)
            f.write("\n")
    print("pydantic", pydantic.VERSION)
